"""Datasets: the built-in shapes set; the user's own COCO files (``DATASETS.COCO_JSONS``,
:mod:`.coco_json`); OpenImages from the official files; the resumable training loader and
its sampler (:mod:`.build`) and its worker processes (:mod:`.workers`); the data position
a checkpoint holds (:mod:`.position`); the test loader that skips unreadable images
(:mod:`.test_loader`); the checks of a run's datasets before launch (:mod:`.checks`).

Importing this package registers the OpenImages V6 splits (under
:func:`~largedet.data.openimages.default_openimages_root`) in Detectron2's catalogs,
as ``detectron2.data`` does for its built-in datasets: only paths are recorded; files
are read on first use. Where datasets and caches live, and how generated ones are
written once, is :mod:`largedet.data.locations`.

The generated OpenImages fixture (:mod:`largedet.data.openimages.fixture`) is imported
and registered only where it is used: ``write_openimages_fixture`` and
``register_openimages_fixture`` are importable from here, loaded on first access.
"""

import importlib

from .build import (
    ResumableLoader,
    ResumableTrainingSampler,
    build_test_loader,
    build_train_loader,
    image_seed,
)
from .coco_json import (
    CocoJson,
    CocoJsonError,
    check_coco_json,
    check_image_sizes,
    coco_jsons_from_config,
    drop_unusable_boxes,
    register_coco_jsons,
)
from .locations import build_once, cache_root, datasets_root
from .openimages import (
    OpenImagesDataset,
    OpenImagesFormatError,
    load_openimages_dataset,
    register_all_openimages,
    register_openimages,
)
from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import ShapesSpec, generate_shapes, register_shapes, shapes_spec_from_config

# Exported names loaded on first access -> the submodule that defines them.
_LAZY_EXPORTS = {
    "register_openimages_fixture": "openimages.fixture",
    "write_openimages_fixture": "openimages.fixture",
}

__all__ = [
    "ResumableLoader",
    "ResumableTrainingSampler",
    "build_test_loader",
    "build_train_loader",
    "image_seed",
    "CocoJson",
    "CocoJsonError",
    "check_coco_json",
    "check_image_sizes",
    "coco_jsons_from_config",
    "drop_unusable_boxes",
    "register_coco_jsons",
    "OpenImagesDataset",
    "OpenImagesFormatError",
    "SHAPES_CLASSES",
    "ShapesSpec",
    "build_once",
    "cache_root",
    "datasets_root",
    "generate_shapes",
    "load_openimages_dataset",
    "register_all_openimages",
    "register_openimages",
    "register_shapes",
    "shapes_spec_from_config",
    *_LAZY_EXPORTS,
]


def __getattr__(name: str):
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


register_all_openimages()
