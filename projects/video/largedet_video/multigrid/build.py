"""Multigrid from the config: ``MULTIGRID.*`` and the base step schedule of ``SOLVER``."""

from __future__ import annotations

import logging

from detectron2.config import CfgNode
from largedet.solver.batch import batch_plan

from .plan import MultigridPlan
from .schedule import build_multigrid_schedule

__all__ = ["multigrid_enabled", "build_multigrid_plan"]

logger = logging.getLogger(__name__)


def multigrid_enabled(cfg: CfgNode) -> bool:
    """Whether ``cfg`` trains with multigrid (``MULTIGRID.LONG_CYCLE`` or ``SHORT_CYCLE``)."""
    return bool(cfg.MULTIGRID.LONG_CYCLE or cfg.MULTIGRID.SHORT_CYCLE)


def build_multigrid_plan(cfg: CfgNode, num_samples: int, world_size: int) -> MultigridPlan:
    """The multigrid plan of ``cfg`` on ``num_samples`` training clips and ``world_size``
    devices.

    The base shape is the batch plan's clips per device pass x ``INPUT.VIDEO.NUM_FRAMES``
    x ``INPUT.VIDEO.TRAIN_CROP_SIZE``. The base schedule is ``SOLVER.MAX_ITER`` steps with
    the LR x ``SOLVER.GAMMA`` at each of ``SOLVER.STEPS``, at ``SOLVER.IMS_PER_BATCH``
    clips per step: in epochs, ``round(steps x IMS_PER_BATCH / num_samples)``.
    """
    solver, video, mg = cfg.SOLVER, cfg.INPUT.VIDEO, cfg.MULTIGRID
    if solver.LR_SCHEDULER_NAME != "WarmupMultiStepLR":
        raise ValueError(
            "Multigrid rescales a step schedule: set SOLVER.LR_SCHEDULER_NAME "
            f"'WarmupMultiStepLR' with SOLVER.STEPS (got {solver.LR_SCHEDULER_NAME!r})."
        )
    batch = batch_plan(cfg, world_size)
    steps_per_epoch = num_samples / solver.IMS_PER_BATCH
    lr_steps = [0] + [round(s / steps_per_epoch) for s in solver.STEPS]
    max_epoch = round(solver.MAX_ITER / steps_per_epoch)
    try:
        schedule = build_multigrid_schedule(
            batch.per_device,
            video.NUM_FRAMES,
            video.TRAIN_CROP_SIZE,
            lr_steps,
            max_epoch,
            solver.GAMMA,
            mg.LONG_CYCLE,
            mg.SHORT_CYCLE,
            long_cycle_factors=[tuple(f) for f in mg.LONG_CYCLE_FACTORS],
            short_cycle_factors=list(mg.SHORT_CYCLE_FACTORS),
            epoch_factor=mg.EPOCH_FACTOR,
            scale_lr=mg.SCALE_LR,
        )
    except ValueError as e:
        raise ValueError(
            f"{e} (SOLVER.STEPS {tuple(solver.STEPS)} and MAX_ITER {solver.MAX_ITER} at "
            f"{steps_per_epoch:.3g} steps per epoch of {num_samples} clips: LR steps at "
            f"epochs {lr_steps[1:]}, {max_epoch} epochs)"
        ) from e
    return MultigridPlan.create(
        schedule,
        num_samples,
        world_size,
        batch.accumulation,
        solver.IMS_PER_BATCH,
        solver.MAX_ITER,
    )
