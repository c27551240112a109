"""Training: the video trainer (largedet's ``largedet.engine.Trainer`` with video data,
evaluation and multigrid), its config and set-up, hooks, the multigrid LR scheduler and
stage hook. Processes are started by largedet's ``largedet.launch.processes``."""

from .defaults import DEFAULT_CONFIG, build_cfg, setup
from .hooks import SkippedVideosHook
from .multigrid import MultigridHook, VideoRunPlan, build_multigrid_lr_scheduler, multigrid_run_plan
from .trainer import VideoParts, VideoTrainer

__all__ = [
    "DEFAULT_CONFIG",
    "MultigridHook",
    "SkippedVideosHook",
    "VideoParts",
    "VideoRunPlan",
    "VideoTrainer",
    "build_cfg",
    "build_multigrid_lr_scheduler",
    "multigrid_run_plan",
    "setup",
]
