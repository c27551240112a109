"""Detectron2 wiring of largedet's optimizers: parameter groups and ``build_optimizer``."""

from .build import (
    NORM_MODULE_TYPES,
    OPTIMIZER_REGISTRY,
    agvm_start_iter,
    build_agvm,
    build_optimizer,
    get_optimizer_params,
    log_param_groups,
    model_parts,
    optimizer_param_groups,
)
from .lr_scheduler import LRScaling, build_lr_scheduler, lr_scaling, warmup_steps, with_scaled_lr
from .plan import RunPlan, run_plan

__all__ = [
    "NORM_MODULE_TYPES",
    "OPTIMIZER_REGISTRY",
    "LRScaling",
    "RunPlan",
    "agvm_start_iter",
    "build_agvm",
    "build_lr_scheduler",
    "build_optimizer",
    "get_optimizer_params",
    "log_param_groups",
    "lr_scaling",
    "model_parts",
    "optimizer_param_groups",
    "run_plan",
    "warmup_steps",
    "with_scaled_lr",
]
