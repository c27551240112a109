"""Multigrid training (Wu et al., CVPR 2020): the schedule of mini-batch shapes
and the batch sampler that carries each batch's shape to the dataset.

Sub-batch BN, the third piece, lives with the other layers in
:mod:`largedet_video.layers.subbatch_bn`.
"""

from .build import build_multigrid_plan, multigrid_enabled
from .plan import MultigridParamScheduler, MultigridPlan
from .sampler import MultigridBatchSampler
from .schedule import (
    DEFAULT_EPOCH_FACTOR,
    DEFAULT_LONG_CYCLE_FACTORS,
    DEFAULT_SHORT_CYCLE_FACTORS,
    ClipShape,
    LRStep,
    MultigridSchedule,
    MultigridStage,
    build_multigrid_schedule,
)

__all__ = [
    "ClipShape",
    "LRStep",
    "MultigridBatchSampler",
    "MultigridParamScheduler",
    "MultigridPlan",
    "build_multigrid_plan",
    "multigrid_enabled",
    "MultigridSchedule",
    "MultigridStage",
    "build_multigrid_schedule",
    "DEFAULT_EPOCH_FACTOR",
    "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS",
]
