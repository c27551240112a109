"""Datasets: the built-in shapes set; OpenImages from the official files.

Importing this package registers the OpenImages V6 splits (under
:func:`~largedet.data.openimages.default_openimages_root`) and the generated
OpenImages fixture in Detectron2's catalogs, as ``detectron2.data`` does for its
built-in datasets: only paths are recorded; files are read on first use.
"""

from .openimages import (
    OpenImagesDataset,
    OpenImagesFormatError,
    load_openimages_dataset,
    register_all_openimages,
    register_openimages,
)
from .openimages_fixture import register_openimages_fixture, write_openimages_fixture
from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import ShapesSpec, generate_shapes, register_shapes, shapes_spec_from_config

__all__ = [
    "OpenImagesDataset",
    "OpenImagesFormatError",
    "SHAPES_CLASSES",
    "ShapesSpec",
    "generate_shapes",
    "load_openimages_dataset",
    "register_all_openimages",
    "register_openimages",
    "register_openimages_fixture",
    "register_shapes",
    "shapes_spec_from_config",
    "write_openimages_fixture",
]

register_all_openimages()
register_openimages_fixture()
