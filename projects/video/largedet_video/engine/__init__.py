"""Training: hooks and process launch. The trainer itself is largedet's
(``largedet.engine.Trainer``) with the video builders of ``projects/video/train.py``."""

from .hooks import SkippedVideosHook
from .launch import launch, launched_by_torchrun, planned_world_size
from .multigrid import MultigridHook, build_multigrid_lr_scheduler

__all__ = [
    "MultigridHook",
    "SkippedVideosHook",
    "build_multigrid_lr_scheduler",
    "launch",
    "launched_by_torchrun",
    "planned_world_size",
]
