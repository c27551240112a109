"""A user's own COCO-format datasets: registered from the config (``DATASETS.COCO_JSONS``),
their annotation files checked before launch, and boxes that cannot be trained on left out.

``DATASETS.COCO_JSONS`` is a list of ``[name, json_file, image_root]`` triples; each is
registered with Detectron2's ``register_coco_instances`` (so ``COCOEvaluator`` evaluates
it) under its name, for ``DATASETS.TRAIN`` and ``DATASETS.TEST``.

:func:`check_coco_json` reads an annotation file once before any worker starts and names
what Detectron2's ``load_coco_json`` would otherwise fail on later, inside every worker,
after the model is built: a file that is not JSON (cut short by a copy), a ``category_id``
that ``categories`` does not list, an image without ``id`` or ``file_name``, a ``bbox``
that is not four numbers, an annotation id given twice; and what it would read silently
wrong: an image id given twice (annotations would attach to the wrong image), a
``file_name`` outside the image folder (absolute, or ``..`` out of it).

:func:`check_image_sizes` reads the headers of a few of the file's images (PIL, no decoding)
and names the first whose size is not the file's ``width`` x ``height`` (Detectron2 stops
on it in a worker, after the model is built), or an image folder that holds none of them
(a wrong folder: otherwise ``MAX_CONSECUTIVE_SKIPS`` unreadable images in a row, later).

A box of negative width or height (``bbox`` ``[x, y, w, h]`` with ``w < 0`` or ``h < 0``)
would be trained on as the box its corners span (Detectron2's transforms take the min and
max of the corners); a box of zero width or height has no area, and Detectron2's mapper
drops it without a word; a box partly outside its image is clipped to it, without a word
too. :func:`drop_unusable_boxes` leaves the first two kinds, and boxes wholly outside their
image, out of the training data, clips the others to their image, and the loader logs how
many of each (:func:`largedet.data.build.build_train_loader`).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.structures import BoxMode
from PIL import Image

from .unreadable import UNREADABLE_ERRORS, check_image_pixels

__all__ = [
    "COCO_JSONS_KEY",
    "IMAGE_SAMPLE",
    "CocoImage",
    "CocoJson",
    "CocoJsonError",
    "CocoJsonSummary",
    "DroppedBoxes",
    "check_coco_json",
    "check_image_sizes",
    "coco_jsons_from_config",
    "drop_unusable_boxes",
    "register_coco_jsons",
]

#: images of an annotation file whose sizes :func:`check_image_sizes` reads
IMAGE_SAMPLE = 8

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
class CocoImage:
    """One entry of an annotation file's ``images``: its position there, its ``file_name``
    (relative to the image folder) and its ``width`` and ``height`` in pixels."""

    index: int
    file_name: str
    width: int
    height: int


@dataclass(frozen=True)
class CocoJsonSummary:
    """What :func:`check_coco_json` found in a valid file."""

    images: int
    annotations: int
    categories: int
    negative_boxes: int  # boxes of negative width or height, left out of training
    zero_area_boxes: int = 0  # boxes of zero width or height, left out of training
    #: up to :data:`IMAGE_SAMPLE` images that give their size, spread over the file
    sample: Tuple[CocoImage, ...] = ()


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


def _check_file_name(path: str, index: int, file_name: Any) -> None:
    """An image's ``file_name`` must be a path inside the image folder: relative, without
    ``..`` that climbs out of it."""
    if not isinstance(file_name, str) or not file_name:
        raise CocoJsonError(f"{path}: images[{index}] file_name must be a non-empty string, got {file_name!r}")
    parts = os.path.normpath(file_name).split(os.sep)
    if os.path.isabs(file_name) or parts[0] == os.pardir:
        raise CocoJsonError(
            f"{path}: images[{index}] file_name {file_name!r} is outside the image folder: give "
            "a path relative to it (image_root), without .. out of it"
        )


def _refuse_duplicate_ids(path: str, key: str, items: List[dict], why: str) -> None:
    """Each entry of ``items`` (the file's ``key`` list) that has an ``id`` must have its own."""
    first: Dict[Any, int] = {}
    duplicates = []
    for i, item in enumerate(items):
        if "id" not in item:
            continue
        ident = item["id"]  # as the loaders' dicts key them: 1 and 1.0 are one id
        ident = ident if isinstance(ident, (int, float, str)) else repr(ident)
        if ident in first:
            duplicates.append((first[ident], i))
        else:
            first[ident] = i
    if duplicates:
        (j, i), more = duplicates[0], len(duplicates) - 1
        also = f" ({more} more entries repeat an id)" if more else ""
        raise CocoJsonError(
            f"{path}: {key}[{i}] has the id {items[i]['id']!r} of {key}[{j}]{also}: {why}"
        )


_checked: Dict[Tuple[str, int, int], CocoJsonSummary] = {}


def check_coco_json(path: str) -> CocoJsonSummary:
    """Read the COCO instances file ``path`` and check what Detectron2's ``load_coco_json``
    needs: ``images`` with ``id`` and ``file_name`` (a path inside the image folder),
    ``categories`` with ``id``, each annotation's ``category_id`` among them and its
    ``bbox`` (where given) four finite numbers, no image id and no annotation id twice. Raises :class:`CocoJsonError`, one line naming the file and the first
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
        _check_file_name(path, i, image["file_name"])
    _refuse_duplicate_ids(path, "images", images, "annotations would attach to the wrong image")
    _refuse_duplicate_ids(path, "annotations", annotations, "ids must be unique")
    category_ids = set()
    for i, category in enumerate(categories):
        if "id" not in category:
            raise CocoJsonError(f"{path}: categories[{i}] has no 'id'")
        category_ids.add(category["id"])
    negative = zero_area = 0
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
            zero_area += min(box[2], box[3]) == 0
    summary = CocoJsonSummary(
        len(images), len(annotations), len(categories), negative, zero_area, _sample(images)
    )
    _checked[key] = summary
    return summary


def _sample(images: List[dict]) -> Tuple[CocoImage, ...]:
    """Up to :data:`IMAGE_SAMPLE` of ``images`` with an integer ``width`` and ``height``,
    evenly spread from the first to the last."""
    sized = [
        CocoImage(i, str(im["file_name"]), im["width"], im["height"])
        for i, im in enumerate(images)
        if isinstance(im.get("width"), int) and isinstance(im.get("height"), int)
    ]
    if len(sized) <= IMAGE_SAMPLE:
        return tuple(sized)
    step = (len(sized) - 1) / (IMAGE_SAMPLE - 1)
    return tuple(sized[round(k * step)] for k in range(IMAGE_SAMPLE))


#: EXIF orientations that turn the image by 90 degrees (Detectron2's ``read_image`` applies them)
_TRANSPOSED = (5, 6, 7, 8)


def _image_size(path: str) -> Tuple[int, int]:
    """``(width, height)`` of the image at ``path`` as Detectron2's ``read_image`` gives it
    (EXIF orientation applied), from its header alone."""
    with warnings.catch_warnings():  # the pixel limit is checked apart (check_image_pixels)
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = Image.open(path)
    with image:
        width, height = image.size
        if image.getexif().get(0x0112, 1) in _TRANSPOSED:
            width, height = height, width
    return width, height


def check_image_sizes(
    json_file: str, image_root: str, sample: Tuple[CocoImage, ...], max_pixels: Optional[int] = None
) -> None:
    """Read the size of each image of ``sample`` (:attr:`CocoJsonSummary.sample` of
    ``json_file``) under ``image_root`` from its header, as Detectron2 would read it; an
    image of more than ``max_pixels`` pixels (``DATALOADER.MAX_IMAGE_PIXELS``) counts as
    unreadable, as in training. Raises
    :class:`CocoJsonError`, one line, naming the first image whose size is not the one
    ``json_file`` gives, or ``image_root`` where none of the images can be read there (a
    wrong folder). A few unreadable images are no error: training passes over them
    (:class:`~largedet.data.unreadable.SkipUnreadable`)."""
    first_unreadable: Optional[str] = None
    readable = 0
    for image in sample:
        path = os.path.join(image_root, image.file_name)
        try:
            check_image_pixels(path, max_pixels)
            width, height = _image_size(path)
        except UNREADABLE_ERRORS as e:  # missing, not an image, a broken header, too large
            if first_unreadable is None:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                first_unreadable = f"{path}: {reason}"
            continue
        readable += 1
        if (width, height) != (image.width, image.height):
            raise CocoJsonError(
                f"{json_file}: images[{image.index}] {image.file_name!r} is {image.width}x"
                f"{image.height} (width x height) there, but its file {path} is {width}x{height}"
            )
    if sample and not readable:
        raise CocoJsonError(
            f"{image_root}: none of the {len(sample)} images of {json_file} looked up there "
            f"can be read (the first: {first_unreadable}); is it this file's image folder?"
        )


def _box_size(ann: Dict[str, Any]) -> str:
    """``"negative"`` for an annotation whose box has a negative width or height,
    ``"zero_area"`` for one of zero width or height, ``""`` otherwise (or without a box)."""
    box = ann.get("bbox")
    if box is None:
        return ""
    mode = ann.get("bbox_mode", BoxMode.XYWH_ABS)
    if mode == BoxMode.XYWH_ABS:
        width, height = box[2], box[3]
    elif mode == BoxMode.XYXY_ABS:
        width, height = box[2] - box[0], box[3] - box[1]
    else:
        return ""
    if width < 0 or height < 0:
        return "negative"
    return "zero_area" if width == 0 or height == 0 else ""


def _clip(ann: Dict[str, Any], width: Any, height: Any) -> str:
    """Clip the box of ``ann`` (usable: positive width and height) to its image of ``width``
    x ``height`` pixels, in place: ``"clipped"`` where part of it was outside, ``"outside"``
    where all of it was (nothing left to train on), ``""`` otherwise (or without a size)."""
    mode = ann.get("bbox_mode", BoxMode.XYWH_ABS)
    box = ann.get("bbox")
    if box is None or not (_finite_number(width) and _finite_number(height)) or mode not in (
        BoxMode.XYWH_ABS, BoxMode.XYXY_ABS
    ):
        return ""
    x0, y0 = box[0], box[1]
    x1, y1 = (x0 + box[2], y0 + box[3]) if mode == BoxMode.XYWH_ABS else (box[2], box[3])
    c0, d0, c1, d1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
    if (c0, d0, c1, d1) == (x0, y0, x1, y1):
        return ""
    if c1 <= c0 or d1 <= d0:
        return "outside"
    ann["bbox"] = [c0, d0, c1 - c0, d1 - d0] if mode == BoxMode.XYWH_ABS else [c0, d0, c1, d1]
    return "clipped"


@dataclass(frozen=True)
class DroppedBoxes:
    """How many boxes :func:`drop_unusable_boxes` left out, of each kind, and clipped."""

    negative: int  # of negative width or height
    zero_area: int  # of zero width or height (and none negative)
    outside: int = 0  # wholly outside their image
    clipped: int = 0  # partly outside their image: clipped to it, kept


def drop_unusable_boxes(dataset_dicts: List[Dict[str, Any]]) -> DroppedBoxes:
    """Remove, in place, the annotations of ``dataset_dicts`` (Detectron2's dataset dicts)
    whose box has a negative width or height (``XYWH_ABS``: ``w < 0`` or ``h < 0``;
    ``XYXY_ABS``: ``x1 < x0`` or ``y1 < y0``), no area (a width or height of 0) or lies wholly
    outside its image (``width`` x ``height`` of the dict), and clip to the image the boxes
    that lie partly outside it (as Detectron2's mapper would, without a word). Returns how
    many of each."""
    counts = {"negative": 0, "zero_area": 0, "outside": 0, "clipped": 0}
    for d in dataset_dicts:
        anns = d.get("annotations")
        if not anns:
            continue
        kinds = [_box_size(a) or _clip(a, d.get("width"), d.get("height")) for a in anns]
        if any(kinds):
            for kind in filter(None, kinds):
                counts[kind] += 1
            d["annotations"] = [a for a, kind in zip(anns, kinds) if kind in ("", "clipped")]
    return DroppedBoxes(**counts)
