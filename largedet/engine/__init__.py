"""Training: the trainer as wiring (:class:`Trainer`, which builds and connects, as
Detectron2's ``DefaultTrainer``), the loop of one optimizer step (gradient accumulation,
DDP no_sync, AMP: :mod:`.train_loop`), the hooks (divergence guard and its rollback,
per-step seeding, model EMA; a user's, by name: :data:`HOOK_REGISTRY`), the writers, the command line and set-up shared by the
scripts (:mod:`.defaults`), LazyConfig training (:mod:`.lazy`) and inference on single
images (:class:`Predictor`).

What the trainer connects lives elsewhere: every derived number in the run plan
(:mod:`largedet.solver.plan`, nothing here recomputes it), the optimizers and LR schedule
(:mod:`largedet.solver`), the data stream and its position (:mod:`largedet.data`),
checkpoints (:mod:`largedet.checkpoint`), and the job around the run: processes,
pre-emption, the output folder's lock and the run summary (:mod:`largedet.launch`,
whose ``launch`` and ``check_and_launch`` are re-exported here)."""

from .. import modeling  # noqa: F401  (registers largedet's backbones)
from ..launch.job import check_and_launch
from .defaults import (
    check_args,
    check_engine_keys,
    largedet_argument_parser,
    print_box_ap,
    setup_cfg,
    train_or_evaluate,
)
from .ema import EMAHook, ModelEMA
from .hooks import HOOK_REGISTRY, DivergenceGuard, ReseedEveryIter, step_seed
from ..launch.processes import launch, launched_by_torchrun, planned_world_size, shut_down_distributed
from .predictor import Predictor
from .train_loop import AccumulationTrainer
from .trainer import Trainer

__all__ = [
    "HOOK_REGISTRY",
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
