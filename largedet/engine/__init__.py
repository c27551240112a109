"""Training: the trainer (gradient accumulation, DDP no_sync, AMP), hooks, checkpoints,
the resumable data stream, the command line, set-up and process launch."""

from .. import modeling  # noqa: F401  (registers largedet's backbones)
from .batch import BatchArithmeticError, BatchPlan, batch_plan
from .checkpoint import AtomicCheckpointer
from .data import ResumableLoader, ResumableTrainingSampler, build_train_loader
from .defaults import (
    check_batch_arithmetic,
    largedet_argument_parser,
    print_box_ap,
    resolve_device,
    setup_cfg,
    train_or_evaluate,
)
from .ema import EMAHook, ModelEMA
from .hooks import DivergenceGuard, ReseedEveryIter, step_seed
from .launch import check_and_launch, launch, launched_by_torchrun, planned_world_size
from .train_loop import AccumulationTrainer
from .trainer import Trainer, describe_run

__all__ = [
    "AccumulationTrainer",
    "AtomicCheckpointer",
    "BatchArithmeticError",
    "BatchPlan",
    "DivergenceGuard",
    "ReseedEveryIter",
    "ResumableLoader",
    "ResumableTrainingSampler",
    "Trainer",
    "batch_plan",
    "build_train_loader",
    "check_batch_arithmetic",
    "describe_run",
    "check_and_launch",
    "largedet_argument_parser",
    "launch",
    "launched_by_torchrun",
    "planned_world_size",
    "print_box_ap",
    "resolve_device",
    "setup_cfg",
    "step_seed",
    "train_or_evaluate",
]
