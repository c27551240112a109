"""Training: the trainer, its hooks, and launching processes."""

from .hooks import SkippedVideosHook
from .launch import launch, launched_by_torchrun
from .trainer import VideoTrainer, create_ddp_model, log_run_summary

__all__ = [
    "VideoTrainer",
    "create_ddp_model",
    "log_run_summary",
    "SkippedVideosHook",
    "launch",
    "launched_by_torchrun",
]
