"""The trainer's hooks in their order (:func:`default_hooks`)."""

from __future__ import annotations

from detectron2.engine import hooks as d2_hooks
from detectron2.engine.hooks import EvalHook
from detectron2.utils import comm
from fvcore.nn.precise_bn import get_bn_modules

from ..data.build import DetectionTrainLoader
from ..launch.preemption import PreemptionHook
from ..launch.run_summary import RunSummaryHook
from .ema import EMAHook
from .hooks import DivergenceGuard, PruningPeriodicCheckpointer, ReseedEveryIter, SkippedImagesHook, build_config_hooks
from .writers import EarlyPeriodicWriter

__all__ = ["default_hooks"]


def default_hooks(trainer) -> list:
    """The hooks of ``trainer`` (:class:`~largedet.engine.Trainer`), in order:
    Detectron2's (:func:`_detectron2_hooks`), with per-step seeding (``RESEED_EVERY_ITER``)
    and the divergence guard after the timer, before the LR scheduler and the
    checkpointer; the model EMA after the guard (a rolled-back step is not averaged);
    pre-emption after the LR step and the periodic checkpoint, before evaluating;
    ``data/skipped_images`` every ``LOG_PERIOD`` steps; then the hooks ``HOOKS`` names
    (:data:`~largedet.engine.hooks.HOOK_REGISTRY`) and the run summary."""
    cfg = trainer.cfg
    hooks = _detectron2_hooks(trainer)
    ours = [DivergenceGuard.from_config(cfg)]
    if trainer.ema is not None:
        ours.append(EMAHook(trainer.ema, trainer.plan.batch_at))
    evaluation = next(i for i, h in enumerate(hooks) if isinstance(h, EvalHook))
    hooks.insert(evaluation, PreemptionHook(cfg.PREEMPTION.SIGNALS))
    if cfg.RESEED_EVERY_ITER:
        ours.insert(0, ReseedEveryIter(cfg.SEED))
    if isinstance(trainer.data_loader, DetectionTrainLoader):
        ours.append(SkippedImagesHook(trainer.data_loader, cfg.LOG_PERIOD))
    hooks[1:1] = ours
    return hooks + [*build_config_hooks(cfg), RunSummaryHook(trainer.run_end)]


def _detectron2_hooks(trainer) -> list:
    """The hooks of ``DefaultTrainer.build_hooks``, in its order, with the writers'
    period ``LOG_PERIOD`` (Detectron2's is fixed at 20)."""
    cfg = trainer.cfg.clone()
    cfg.defrost()
    cfg.DATALOADER.NUM_WORKERS = 0  # PreciseBN's own loader, as Detectron2 builds it
    precise_bn = cfg.TEST.PRECISE_BN.ENABLED and get_bn_modules(trainer.model)
    # The order is Detectron2's and matters: the timer first (it times the other hooks
    # out of the step); the LR steps before anything reads it; precise BN before the
    # checkpointer, so that checkpoints hold the recomputed statistics; the checkpointer
    # before the evaluation, so that a failed evaluation loses no trained step; the
    # writers last, so that they write the evaluation's results of the same step.
    hooks = [
        d2_hooks.IterationTimer(),
        d2_hooks.LRScheduler(),
        d2_hooks.PreciseBN(
            cfg.TEST.EVAL_PERIOD, trainer.model, trainer.parts.build_train_loader(cfg),
            cfg.TEST.PRECISE_BN.NUM_ITER,
        ) if precise_bn else None,
    ]  # fmt: skip
    if comm.is_main_process():
        hooks.append(PruningPeriodicCheckpointer(
            trainer.checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD, cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP
        ))  # fmt: skip
    hooks.append(EvalHook(cfg.TEST.EVAL_PERIOD, trainer.evaluation))
    if comm.is_main_process():
        hooks.append(EarlyPeriodicWriter(trainer.build_writers(), period=trainer.cfg.LOG_PERIOD))
    return hooks
