"""Detectron2 wiring of largedet's optimizers, and the run plan.

- :mod:`.plan` and :mod:`.batch`: the run plan, every number a run derives from its config
  (world size, global and per-device batch, K, the batch schedule, the scaled LR, the
  warm-up, the clipping), computed once and passed to what reads it; the only places
  where that arithmetic is written;
- :mod:`.build`: parameter groups, ``build_optimizer`` and its registry, AGVM;
- :mod:`.lr_scheduler`: the LR schedule around the plan's peak LR.
"""

from .build import (
    BUILT_IN_OPTIMIZERS,
    NORM_MODULE_TYPES,
    OPTIMIZER_REGISTRY,
    build_agvm,
    build_optimizer,
    check_optimizer_name,
    describe_agvm_parts,
    get_optimizer_params,
    log_param_groups,
    model_parts,
    optimizer_param_groups,
    register_built_in_optimizers,
)
from .lr_scheduler import build_lr_scheduler, build_schedule, with_scaled_lr
from .plan import LRScaling, RunPlan, agvm_start_iter, lr_scaling, run_plan, warmup_steps, with_run_length

__all__ = [
    "NORM_MODULE_TYPES",
    "BUILT_IN_OPTIMIZERS",
    "OPTIMIZER_REGISTRY",
    "LRScaling",
    "RunPlan",
    "agvm_start_iter",
    "build_agvm",
    "build_lr_scheduler",
    "build_optimizer",
    "build_schedule",
    "check_optimizer_name",
    "describe_agvm_parts",
    "get_optimizer_params",
    "log_param_groups",
    "lr_scaling",
    "model_parts",
    "optimizer_param_groups",
    "register_built_in_optimizers",
    "run_plan",
    "warmup_steps",
    "with_run_length",
    "with_scaled_lr",
]
