"""Training: hooks and process launch. The trainer itself is largedet's
(``largedet.engine.Trainer``) with the video builders of ``projects/video/train.py``."""

from .hooks import SkippedVideosHook
from .launch import launch, launched_by_torchrun, planned_world_size

__all__ = ["SkippedVideosHook", "launch", "launched_by_torchrun", "planned_world_size"]
