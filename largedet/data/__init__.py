"""Datasets: the built-in shapes set; OpenImages from the official files."""

from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import ShapesSpec, generate_shapes, register_shapes, shapes_spec_from_config

__all__ = ["SHAPES_CLASSES", "ShapesSpec", "generate_shapes", "register_shapes", "shapes_spec_from_config"]
