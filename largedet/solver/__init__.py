"""Detectron2 wiring of largedet's optimizers: parameter groups and ``build_optimizer``."""

from .build import NORM_MODULE_TYPES, OPTIMIZER_REGISTRY, build_optimizer, get_optimizer_params

__all__ = ["NORM_MODULE_TYPES", "OPTIMIZER_REGISTRY", "build_optimizer", "get_optimizer_params"]
