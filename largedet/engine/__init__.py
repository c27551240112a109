"""Training: the trainer (gradient accumulation, DDP no_sync, AMP), hooks, checkpoints,
the resumable data stream, the command line and set-up."""

from .. import modeling  # noqa: F401  (registers largedet's backbones)
from .batch import BatchArithmeticError, BatchPlan, batch_plan
from .checkpoint import AtomicCheckpointer
from .data import ResumableLoader, ResumableTrainingSampler, build_train_loader
from .defaults import check_batch_arithmetic, largedet_argument_parser, resolve_device, setup_cfg
from .hooks import DivergenceGuard, ReseedEveryIter, step_seed
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
    "largedet_argument_parser",
    "resolve_device",
    "setup_cfg",
    "step_seed",
]
