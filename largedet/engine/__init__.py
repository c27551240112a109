"""Training: the trainer (gradient accumulation, DDP no_sync, AMP), its loop and hooks
(divergence guard, model EMA, pre-emption, run summary), the command line and set-up
shared by the scripts, inference on single images (:class:`Predictor`), and process
launch (Detectron2's ``launch``, ``torchrun``, Slurm).

Checkpoints are :mod:`largedet.checkpoint`, the training and test loaders
:mod:`largedet.data`, the batch arithmetic :mod:`largedet.solver.batch`, the config's keys,
checks and LazyConfig mapping :mod:`largedet.config`."""

from .. import modeling  # noqa: F401  (registers largedet's backbones)
from .defaults import (
    check_and_launch,
    check_args,
    check_engine_keys,
    largedet_argument_parser,
    print_box_ap,
    setup_cfg,
    train_or_evaluate,
)
from .ema import EMAHook, ModelEMA
from .hooks import DivergenceGuard, ReseedEveryIter, step_seed
from .launch import launch, launched_by_torchrun, planned_world_size, shut_down_distributed
from .predictor import Predictor
from .train_loop import AccumulationTrainer
from .trainer import Trainer, describe_run

__all__ = [
    "AccumulationTrainer",
    "DivergenceGuard",
    "EMAHook",
    "ModelEMA",
    "Predictor",
    "ReseedEveryIter",
    "Trainer",
    "check_and_launch",
    "check_args",
    "check_engine_keys",
    "describe_run",
    "largedet_argument_parser",
    "launch",
    "launched_by_torchrun",
    "planned_world_size",
    "print_box_ap",
    "setup_cfg",
    "shut_down_distributed",
    "step_seed",
    "train_or_evaluate",
]
