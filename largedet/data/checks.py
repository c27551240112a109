"""The checks of a run's datasets before any worker starts, each error one line naming the
key (a :class:`~largedet.config.errors.ConfigError`): the datasets registered (else a line
saying how to register one: ``DATASETS.COCO_JSONS``), the annotation file of a COCO-style
dataset present and loadable (:func:`~largedet.data.coco_json.check_coco_json`: JSON, category
ids, boxes), its image folder present, an OpenImages split's files present (the built-in
shapes set and the OpenImages fixture are generated on first use); for training, the
model's number of classes against the categories of each COCO json it trains on
(:func:`check_num_classes`); with the run's files, a sample of each COCO json's image sizes
against its images (:func:`check_image_files`). The entry points call them
(:func:`largedet.engine.defaults.check_config`)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from ..config.errors import ConfigError
from ..config.validate import lookup_key
from .coco_json import COCO_JSONS_KEY, CocoJsonError, check_coco_json, check_image_sizes
from .unreadable import max_image_pixels

__all__ = ["check_datasets", "check_image_files", "check_num_classes", "not_registered", "num_classes_key"]


def _generated(meta) -> bool:
    """Whether the dataset's files are written on first use (the built-in shapes set, the
    OpenImages fixture): nothing to check before launch."""
    return meta.get("shapes_spec", None) is not None or meta.get("generated", False)


def _d2_hint(path: str) -> str:
    d2_root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
    if os.path.normpath(path).startswith(os.path.normpath(d2_root) + os.sep):
        return f"; Detectron2's datasets are read under $DETECTRON2_DATASETS (now {d2_root!r})"
    return ""


def _check_annotation_file(key: str, name: str) -> None:
    """A dataset's ``json_file`` must exist and its ``image_root`` be a folder, and a COCO
    dataset's file (evaluator type "coco") be a COCO instances file that Detectron2 can load
    (:func:`~largedet.data.check_coco_json`), unless the dataset is generated on first use."""
    meta = MetadataCatalog.get(name)
    json_file = meta.get("json_file", None)
    if not json_file or _generated(meta):
        return
    if not os.path.isfile(json_file):
        what = "is a folder, not a file" if os.path.isdir(json_file) else "not found"
        raise ConfigError(
            f"{json_file}: annotation file of dataset {name!r} ({key}) {what}{_d2_hint(json_file)}"
        )
    image_root = meta.get("image_root", None)
    if image_root and not os.path.isdir(image_root):
        raise ConfigError(
            f"{image_root}: image folder of dataset {name!r} ({key}) not found{_d2_hint(image_root)}"
        )
    if meta.get("evaluator_type", None) != "coco":  # LVIS and other formats: present is enough
        return
    try:
        check_coco_json(json_file)
    except CocoJsonError as e:
        raise ConfigError(f"{e} (dataset {name!r}, {key})") from None


#: The OpenImages files a split's training reads, and those its evaluation reads besides
#: (:func:`largedet.data.register_openimages`'s metadata)
_OPENIMAGES_TRAIN_FILES = ("class_descriptions_csv", "class_subset_csv", "boxes_csv")
_OPENIMAGES_TEST_FILES = ("image_labels_csv", "hierarchy_json")


def _check_openimages_files(key: str, name: str) -> None:
    """An OpenImages split's official files (and its image folder) must exist, unless it is
    generated on first use."""
    meta = MetadataCatalog.get(name)
    if meta.get("evaluator_type", None) != "openimages" or _generated(meta):
        return
    fields = _OPENIMAGES_TRAIN_FILES + (_OPENIMAGES_TEST_FILES if key == "DATASETS.TEST" else ())
    for field in fields:
        path = meta.get(field, None)
        if path and not os.path.isfile(path):
            raise ConfigError(
                f"{path}: file of dataset {name!r} ({key}) not found; OpenImages is read from "
                "DATASETS.OPENIMAGES.ROOT (docs/evaluation.md)"
            )
    images_dir = meta.get("images_dir", None)
    if images_dir and not os.path.isdir(images_dir):
        raise ConfigError(
            f"{images_dir}: image folder of dataset {name!r} ({key}) not found; OpenImages is "
            "read from DATASETS.OPENIMAGES.ROOT (docs/evaluation.md)"
        )


def not_registered(key: str, name: str) -> str:
    """The one line for a dataset ``name`` (given by ``key``: a config key or a flag) that
    Detectron2's ``DatasetCatalog`` does not hold: the registered names close to it and how
    to register one."""
    registered = DatasetCatalog.list()
    close = difflib.get_close_matches(name, registered, n=5, cutoff=0.6)
    hint = (
        f"registered names close to it: {', '.join(close)}"
        if close
        else f"none of the {len(registered)} registered names is close to it"
    )
    return (
        f"{key}: dataset {name!r} is not registered; {hint}; register a COCO-format "
        f"dataset with {COCO_JSONS_KEY} [[name, json_file, image_root]] "
        "(docs/training.md#your-own-coco-dataset), or any dataset in a module "
        "given to --import (docs/extend.md)"
    )


def check_datasets(cfg: CfgNode, keys: Sequence[str], *, required: Sequence[str] = ()) -> None:
    """Every dataset named by the config keys ``keys`` (``"DATASETS.TRAIN"``) must be
    registered in Detectron2's ``DatasetCatalog`` (by largedet, the config or a module of
    ``--import``; the error lists registered names close to it) and have its annotation file; each key in ``required`` must name at least one."""
    registered = DatasetCatalog.list()
    for key in keys:
        names = lookup_key(cfg, key)[1]
        if key in required and not names:
            raise ConfigError(f"{key}: no dataset given; name at least one registered dataset")
        for name in names:
            if name not in registered:
                raise ConfigError(not_registered(key, name))
            _check_annotation_file(key, name)
            _check_openimages_files(key, name)


def _coco_json(name: str) -> tuple[str, str] | None:
    """``(json_file, image_root)`` of the COCO-format dataset ``name`` whose annotation file
    exists (checked by :func:`check_datasets`), None for another dataset or one generated on
    first use."""
    meta = MetadataCatalog.get(name)
    json_file = meta.get("json_file", None)
    if meta.get("evaluator_type", None) != "coco" or not json_file or _generated(meta):
        return None
    if not os.path.isfile(json_file):
        return None
    return json_file, meta.get("image_root", "")


def num_classes_key(cfg: CfgNode) -> str | None:
    """The key of the model's number of classes: ``MODEL.RETINANET.NUM_CLASSES`` for a
    RetinaNet, ``MODEL.ROI_HEADS.NUM_CLASSES`` for Detectron2's other detectors; None for a
    config without either."""
    retinanet = lookup_key(cfg, "MODEL.META_ARCHITECTURE")[1] == "RetinaNet"
    key = "MODEL.RETINANET.NUM_CLASSES" if retinanet else "MODEL.ROI_HEADS.NUM_CLASSES"
    return key if lookup_key(cfg, key)[0] else None


def check_num_classes(names: Sequence[str], key: str, num_classes: int) -> None:
    """A model of ``num_classes`` classes (the config key ``key``) must have one for each
    category of every COCO json of the training datasets ``names``: Detectron2 maps the
    categories to ``0 .. K-1`` and would train the classes past ``num_classes`` as
    background, without a word. Raises :class:`ConfigError` naming the key, its value, the
    json and its count. More classes than categories are allowed (the extra classes are
    never trained), as Detectron2 allows them."""
    for name in names:
        found = _coco_json(name)
        if found is None:
            continue
        categories = check_coco_json(found[0]).categories
        if categories > num_classes:
            raise ConfigError(
                f"{key}: {num_classes}, but {found[0]} (dataset {name!r}) has {categories} "
                f"categories, which the model could not tell apart; set {key} {categories}"
            )


def check_image_files(cfg: CfgNode, keys: Sequence[str]) -> None:
    """For each COCO json of the datasets the config keys ``keys`` name, a sample of its
    images read from their headers (:func:`~largedet.data.check_image_sizes`): a size that
    is not the json's, or an image folder where none of them is, is a :class:`ConfigError`
    naming the json or the folder, the dataset and the key."""
    for key in keys:
        for name in lookup_key(cfg, key)[1]:
            found = _coco_json(name)
            if found is None or not found[1] or not os.path.isdir(found[1]):
                continue
            json_file, image_root = found
            try:
                check_image_sizes(json_file, image_root, check_coco_json(json_file).sample,
                                  max_image_pixels(cfg))  # fmt: skip
            except CocoJsonError as e:
                raise ConfigError(f"{e} (dataset {name!r}, {key})") from None
