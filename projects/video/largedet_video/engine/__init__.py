"""Training: the video trainer (largedet's ``largedet.engine.Trainer`` with video data,
evaluation and multigrid), its config and set-up, hooks, the multigrid LR scheduler and
stage hook, the wall clock by stage. Processes are started by largedet's ``largedet.launch.processes``."""

from .defaults import DEFAULT_CONFIG, build_cfg, setup
from .hooks import SkippedVideosHook
from .multigrid import MultigridHook, VideoRunPlan, build_multigrid_lr_scheduler, multigrid_run_plan, precise_bn_steps
from .stage_times import (
    STAGE_TIMES_FILE,
    StageTimes,
    StageTimesHook,
    StepShapes,
    append_stage_times,
    format_stage_times,
    read_stage_times,
    step_shapes,
)
from .trainer import VideoParts, VideoTrainer

__all__ = [
    "DEFAULT_CONFIG",
    "MultigridHook",
    "STAGE_TIMES_FILE",
    "SkippedVideosHook",
    "StageTimes",
    "StageTimesHook",
    "StepShapes",
    "VideoParts",
    "VideoRunPlan",
    "VideoTrainer",
    "build_cfg",
    "build_multigrid_lr_scheduler",
    "multigrid_run_plan",
    "precise_bn_steps",
    "append_stage_times",
    "format_stage_times",
    "read_stage_times",
    "step_shapes",
    "setup",
]
