"""A user's own COCO-format datasets: registered from the config (``DATASETS.COCO_JSONS``),
their annotation files checked before launch, and boxes that cannot be trained on left out.

``DATASETS.COCO_JSONS`` is a list of ``[name, json_file, image_root]`` triples; each is
registered with Detectron2's ``register_coco_instances`` (so ``COCOEvaluator`` evaluates
it) under its name, for ``DATASETS.TRAIN`` and ``DATASETS.TEST``.

:func:`check_coco_json` reads an annotation file once before any worker starts and names
what Detectron2's ``load_coco_json`` would otherwise fail on later, inside every worker,
after the model is built: a file that is not JSON (cut short by a copy), a ``category_id``
that ``categories`` does not list, an image without ``id`` or ``file_name``, a ``bbox``
that is not four numbers.

A box of negative width or height (``bbox`` ``[x, y, w, h]`` with ``w < 0`` or ``h < 0``)
would be trained on as the box its corners span (Detectron2's transforms take the min and
max of the corners); :func:`drop_negative_boxes` leaves such boxes out of the training
data, and the loader logs how many (:func:`largedet.data.build.build_train_loader`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.structures import BoxMode

__all__ = [
    "COCO_JSONS_KEY",
    "CocoJson",
    "CocoJsonError",
    "CocoJsonSummary",
    "check_coco_json",
    "coco_jsons_from_config",
    "drop_negative_boxes",
    "register_coco_jsons",
]

#: the config key of the user's COCO-format datasets
COCO_JSONS_KEY = "DATASETS.COCO_JSONS"


class CocoJsonError(ValueError):
    """A ``DATASETS.COCO_JSONS`` entry or a COCO annotation file that cannot be used. The
    message is one line and starts with the key or the file."""


@dataclass(frozen=True)
class CocoJson:
    """One ``[name, json_file, image_root]`` entry of ``DATASETS.COCO_JSONS``."""

    name: str
    json_file: str
    image_root: str


def coco_jsons_from_config(cfg) -> List[CocoJson]:
    """The entries of ``cfg.DATASETS.COCO_JSONS`` (``~`` expanded in the paths). Raises
    :class:`CocoJsonError` for an entry that is not three non-empty strings, or a name
    given twice."""
    entries, seen = [], set()
    for i, entry in enumerate(cfg.DATASETS.COCO_JSONS):
        if (
            not isinstance(entry, (list, tuple))
            or len(entry) != 3
            or not all(isinstance(v, str) and v for v in entry)
        ):
            raise CocoJsonError(
                f"{COCO_JSONS_KEY}[{i}]: expected [name, json_file, image_root] (three "
                f"non-empty strings), got {entry!r}"
            )
        name, json_file, image_root = entry
        if name in seen:
            raise CocoJsonError(f"{COCO_JSONS_KEY}[{i}]: dataset {name!r} is given twice")
        seen.add(name)
        entries.append(
            CocoJson(name, os.path.expanduser(json_file), os.path.expanduser(image_root))
        )
    return entries


def register_coco_jsons(entries: Sequence[CocoJson]) -> None:
    """Register each entry with Detectron2's ``register_coco_instances`` (evaluator type
    "coco"); an entry registered by an earlier call is replaced. Nothing is read here.
    Raises :class:`CocoJsonError` for a name that another registration already took (a
    Detectron2 or largedet built-in dataset)."""
    for entry in entries:
        if entry.name in DatasetCatalog.list():
            if not MetadataCatalog.get(entry.name).get("coco_jsons_entry", False):
                raise CocoJsonError(
                    f"{COCO_JSONS_KEY}: {entry.name!r} is already registered (a built-in "
                    "dataset); give yours another name"
                )
            DatasetCatalog.remove(entry.name)
            MetadataCatalog.remove(entry.name)
        register_coco_instances(entry.name, {}, entry.json_file, entry.image_root)
        MetadataCatalog.get(entry.name).set(coco_jsons_entry=True)


@dataclass(frozen=True)
class CocoJsonSummary:
    """What :func:`check_coco_json` found in a valid file."""

    images: int
    annotations: int
    categories: int
    negative_boxes: int  # boxes of negative width or height, left out of training


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _list_of_dicts(path: str, data: dict, key: str, required: bool) -> List[dict]:
    if key not in data:
        if required:
            raise CocoJsonError(f"{path}: no {key!r} list: not a COCO annotation file")
        return []
    items = data[key]
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise CocoJsonError(f"{path}: {key!r} must be a list of objects")
    return items


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CocoJsonError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); a file cut "
            "short by an interrupted copy or download reads so"
        ) from None
    except UnicodeDecodeError:
        raise CocoJsonError(f"{path}: not valid JSON (not UTF-8 text)") from None
    except IsADirectoryError:
        raise CocoJsonError(f"{path}: is a folder, not an annotation file") from None
    except OSError as e:
        raise CocoJsonError(f"{path}: cannot read it: {e.strerror or e}") from None


_checked: Dict[Tuple[str, int, int], CocoJsonSummary] = {}


def check_coco_json(path: str) -> CocoJsonSummary:
    """Read the COCO instances file ``path`` and check what Detectron2's ``load_coco_json``
    needs: ``images`` with ``id`` and ``file_name``, ``categories`` with ``id``, each
    annotation's ``category_id`` among them and its ``bbox`` (where given) four finite
    numbers. Raises :class:`CocoJsonError`, one line naming the file and the first
    offending entry. A file is read once per process (keyed on its path, size and
    modification time)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key in _checked:
        return _checked[key]
    data = _read_json(path)
    if not isinstance(data, dict):
        raise CocoJsonError(
            f"{path}: the top level must be an object with 'images', 'annotations', 'categories'"
        )
    images = _list_of_dicts(path, data, "images", required=True)
    categories = _list_of_dicts(path, data, "categories", required=True)
    annotations = _list_of_dicts(path, data, "annotations", required=False)
    for i, image in enumerate(images):
        for field in ("id", "file_name"):
            if field not in image:
                raise CocoJsonError(f"{path}: images[{i}] has no {field!r}")
    category_ids = set()
    for i, category in enumerate(categories):
        if "id" not in category:
            raise CocoJsonError(f"{path}: categories[{i}] has no 'id'")
        category_ids.add(category["id"])
    negative = 0
    for i, ann in enumerate(annotations):
        where = f"annotations[{i}] (id {ann.get('id')!r}, image {ann.get('image_id')!r})"
        cid = ann.get("category_id")
        if cid not in category_ids:
            listed = ", ".join(str(c) for c in sorted(category_ids, key=str)[:10])
            more = ", ..." if len(category_ids) > 10 else ""
            raise CocoJsonError(
                f"{path}: {where}: category_id {cid!r} is not among the ids of 'categories' "
                f"({listed}{more})"
            )
        if "bbox" in ann:
            box = ann["bbox"]
            if not isinstance(box, list) or len(box) != 4 or not all(map(_finite_number, box)):
                raise CocoJsonError(
                    f"{path}: {where}: bbox must be [x, y, width, height], got {box!r}"
                )
            negative += box[2] < 0 or box[3] < 0
    summary = CocoJsonSummary(len(images), len(annotations), len(categories), negative)
    _checked[key] = summary
    return summary


def _has_negative_size(ann: Dict[str, Any]) -> bool:
    box = ann.get("bbox")
    if box is None:
        return False
    mode = ann.get("bbox_mode", BoxMode.XYWH_ABS)
    if mode == BoxMode.XYWH_ABS:
        return box[2] < 0 or box[3] < 0
    if mode == BoxMode.XYXY_ABS:
        return box[2] < box[0] or box[3] < box[1]
    return False


def drop_negative_boxes(dataset_dicts: List[Dict[str, Any]]) -> int:
    """Remove, in place, the annotations of ``dataset_dicts`` (Detectron2's dataset dicts)
    whose box has a negative width or height (``XYWH_ABS``: ``w < 0`` or ``h < 0``;
    ``XYXY_ABS``: ``x1 < x0`` or ``y1 < y0``). Returns how many were removed."""
    dropped = 0
    for d in dataset_dicts:
        anns = d.get("annotations")
        if not anns:
            continue
        kept = [a for a in anns if not _has_negative_size(a)]
        if len(kept) != len(anns):
            dropped += len(anns) - len(kept)
            d["annotations"] = kept
    return dropped
