"""The LR schedule: one builder of the warm-up and the schedule, over the run plan's peak LR.

The peak LR is the run plan's (``lr`` of :class:`largedet.solver.plan.RunPlan`: ``SOLVER.BASE_LR``,
or the linear scaling rule's with ``SOLVER.LSR.ENABLED``), and so is the warm-up's length
(``warmup_iters``), each computed once there. Who writes the LR, once each:

- :func:`with_scaled_lr` puts the plan's peak LR into a transient copy of the config for the
  optimizer registry's builders (their contract is Detectron2's, ``(cfg, model)`` reading
  ``SOLVER.BASE_LR``); the parameter groups get it (biases times ``SOLVER.BIAS_LR_FACTOR``,
  as in Detectron2);
- the schedule multiplies each group's initial LR: one Detectron2 ``LRMultiplier`` over a
  ``WarmupParamScheduler`` around a schedule shape, made by :func:`build_schedule` for every
  run: the shapes of ``SOLVER.LR_SCHEDULER_NAME`` (:func:`schedule_shape`: step, cosine,
  warm-up-stable-decay), a LazyConfig's ``lr_multiplier`` and the video project's multigrid
  stages. Detectron2's ``LRScheduler`` hook steps it once per optimizer step; besides its
  steps, only :func:`rescale_schedule` (the divergence guard's rollback) writes the LR of a
  running schedule.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import torch
from detectron2.config import CfgNode
from detectron2.solver import LRMultiplier, WarmupParamScheduler
from fvcore.common.param_scheduler import (
    CompositeParamScheduler,
    ConstantParamScheduler,
    CosineParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
    StepWithFixedGammaParamScheduler,
)

from ..config.keys import LR_SCHEDULES
from .plan import LRScaling, RunPlan

__all__ = [
    "LR_SCHEDULES",
    "ImageClockLRMultiplier",
    "build_lr_scheduler",
    "build_schedule",
    "lr_multiplier",
    "rescale_schedule",
    "schedule_shape",
    "with_scaled_lr",
    "with_warmup",
]

logger = logging.getLogger(__name__)


def with_scaled_lr(cfg: CfgNode, scaling: LRScaling) -> CfgNode:
    """A copy of ``cfg`` whose ``SOLVER.BASE_LR`` is the peak LR ``scaling`` (the run plan's
    ``lr`` of :class:`~largedet.solver.plan.RunPlan`).

    For the builders that read ``SOLVER.BASE_LR`` (``largedet.solver.build_optimizer``,
    Detectron2's LR schedules); the copy is handed to them and not kept. Returns ``cfg``
    itself when the LSR is disabled.
    """
    if not cfg.SOLVER.LSR.ENABLED:
        return cfg
    scaled = cfg.clone()
    scaled.defrost()
    scaled.SOLVER.BASE_LR = scaling.lr
    scaled.freeze()
    return scaled


class _HeldAtTheEnd(ParamScheduler):
    """``shape`` over ``steps`` steps, its value at the last step held at progress 1 (where a
    scheduler stepped after the run's last step asks): fvcore's
    ``StepWithFixedGammaParamScheduler`` has no value there (an ``IndexError``)."""

    def __init__(self, shape: ParamScheduler, steps: int):
        self._shape = shape
        self._last = (steps - 1) / steps if steps > 0 else 0.0

    def __call__(self, where: float) -> float:
        return self._shape(min(where, self._last))


def schedule_shape(cfg: CfgNode, max_iter: int, peak_lr: float) -> ParamScheduler:
    """``SOLVER.LR_SCHEDULER_NAME``'s multiplier of the peak LR as a function of the run's
    progress in [0, 1), without warm-up, over ``max_iter`` steps: Detectron2's shapes as its
    ``build_lr_scheduler`` makes them (``WarmupMultiStepLR``, ``WarmupCosineLR``,
    ``WarmupStepWithFixedGammaLR``), or warm-up-stable-decay (``WarmupStableDecayLR``): 1
    until ``SOLVER.WSD.DECAY_START``, then linear to ``BASE_LR_END / peak_lr``. ``peak_lr``:
    the run's peak LR (the run plan's), which the cosine and the warm-up-stable-decay shapes
    end at ``SOLVER.BASE_LR_END`` from."""
    solver = cfg.SOLVER
    name = solver.LR_SCHEDULER_NAME
    end_value = solver.BASE_LR_END / peak_lr if peak_lr else 0.0
    if name == "WarmupMultiStepLR":
        steps = [x for x in solver.STEPS if x <= max_iter]
        if len(steps) != len(solver.STEPS):
            logger.warning("SOLVER.STEPS %s past the run's %d steps are ignored", tuple(solver.STEPS), max_iter)
        return MultiStepParamScheduler(
            values=[solver.GAMMA**k for k in range(len(steps) + 1)],
            milestones=steps,
            num_updates=max_iter,
        )
    if name == "WarmupCosineLR":
        return CosineParamScheduler(1, end_value)
    if name == "WarmupStepWithFixedGammaLR":
        return _HeldAtTheEnd(
            StepWithFixedGammaParamScheduler(
                base_value=1.0, gamma=solver.GAMMA, num_decays=solver.NUM_DECAYS, num_updates=max_iter
            ),
            max_iter,
        )
    if name == "WarmupStableDecayLR":
        start = solver.WSD.DECAY_START  # in (0, 1): its declared rule
        return CompositeParamScheduler(
            [ConstantParamScheduler(1.0), LinearParamScheduler(1.0, end_value)],
            lengths=[start, 1.0 - start],
            interval_scaling=["rescaled", "rescaled"],
        )
    raise ValueError(f"SOLVER.LR_SCHEDULER_NAME: unknown LR schedule {name!r}; one of {LR_SCHEDULES}")


def with_warmup(
    shape: ParamScheduler,
    cfg: CfgNode,
    warmup_iters: int,
    steps: int,
    rescale_interval: Optional[bool] = None,
) -> ParamScheduler:
    """Detectron2's ``WarmupParamScheduler`` around ``shape``: ``warmup_iters`` of the run's
    ``steps`` steps (the run plan's warm-up), from ``SOLVER.WARMUP_FACTOR`` times the shape's
    first value, ``SOLVER.WARMUP_METHOD``; ``rescale_interval`` (default
    ``SOLVER.RESCALE_INTERVAL``): whether the shape starts after the warm-up rather than
    under it."""
    solver = cfg.SOLVER
    if rescale_interval is None:
        rescale_interval = solver.RESCALE_INTERVAL
    return WarmupParamScheduler(
        shape, solver.WARMUP_FACTOR, warmup_iters / steps, solver.WARMUP_METHOD, rescale_interval
    )


def lr_multiplier(cfg: CfgNode, plan: RunPlan) -> ParamScheduler:
    """The multiplier of the peak LR of ``SOLVER``'s schedule over the run's progress in
    [0, 1): :func:`schedule_shape` over the plan's ``SOLVER.MAX_ITER`` steps after the plan's
    warm-up (:func:`with_warmup`)."""
    shape = schedule_shape(cfg, plan.max_iter, plan.lr.lr)
    return with_warmup(shape, cfg, plan.warmup_iters, plan.max_iter)


class ImageClockLRMultiplier(LRMultiplier):
    """Detectron2's ``LRMultiplier`` for a run whose global batch changes (a batch ramp,
    :class:`~largedet.solver.batch.BatchSchedule`, in the run plan ``plan``): at optimizer
    step t the LR is each group's peak LR x the schedule's multiplier at the run's progress
    in images (``images_before(t) / total_images``) x the scaling rule's ratio of step t's
    batch to the full batch (:meth:`~largedet.solver.plan.RunPlan.lr_factor`).
    ``last_epoch`` counts optimizer steps, as before."""

    def __init__(self, optimizer, multiplier: ParamScheduler, plan: RunPlan, last_iter: int = -1):
        self._plan = plan
        super().__init__(optimizer, multiplier, plan.total_steps, last_iter)

    def factor(self, step: int) -> float:
        """What step ``step`` multiplies the peak LR by."""
        schedule = self._plan.schedule
        where = min(schedule.images_before(step) / schedule.total_images, 1.0)
        return self._multiplier(where) * self._plan.lr_factor(schedule.batch_at(step))

    def get_lr(self) -> List[float]:
        factor = self.factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]


def rescale_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, base_lrs: Sequence[float]) -> None:
    """Give ``scheduler`` the peak LRs ``base_lrs`` (one per parameter group) from its current
    step on, each group's current LR following in proportion (the schedule's value at this
    step). Besides the scheduler's own steps, the one writer of a running schedule's LR: the
    divergence guard's rollback lowers the LR through it."""
    for group, new, old in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.base_lrs):
        group["lr"] = group["lr"] * new / old if old else 0.0
    scheduler.base_lrs = list(base_lrs)


def build_schedule(
    cfg: CfgNode,
    optimizer: torch.optim.Optimizer,
    shape: ParamScheduler,
    plan: RunPlan,
    steps: Optional[int] = None,
    rescale_interval: Optional[bool] = None,
) -> torch.optim.lr_scheduler.LRScheduler:
    """The one builder of a run's LR schedule: ``shape`` (the schedule's multiplier of the
    peak LR over the run's progress in [0, 1), without warm-up) after the run plan's warm-up
    (``plan.warmup_iters`` steps, :func:`with_warmup`), as one Detectron2 ``LRMultiplier``
    over ``steps`` optimizer steps (default: the plan's ``SOLVER.MAX_ITER``). It multiplies
    each parameter group's initial LR (the plan's peak LR) at each step.

    Args:
        shape: :func:`schedule_shape`'s (the yacs path), a LazyConfig's ``lr_multiplier``, or
            the video project's multigrid stages.
        steps: the run's length, as the trainer's ``run_length``; the plan's warm-up is that
            run's (:func:`~largedet.solver.plan.with_run_length`).
        rescale_interval: as :func:`with_warmup` (a shape whose values sit at fixed steps,
            as multigrid's stages, passes False).

    With a ``plan`` whose batch ramps, an :class:`ImageClockLRMultiplier`: the schedule over
    ``SOLVER.MAX_ITER`` steps of the full batch followed in images, times
    ``SOLVER.LSR.RULE``'s factor at each step's batch.
    """
    if plan.schedule.ramped:
        multiplier = with_warmup(shape, cfg, plan.warmup_iters, plan.max_iter, rescale_interval)
        return ImageClockLRMultiplier(optimizer, multiplier, plan)
    steps = plan.max_iter if steps is None else steps
    multiplier = with_warmup(shape, cfg, plan.warmup_iters, steps, rescale_interval)
    return LRMultiplier(optimizer, multiplier=multiplier, max_iter=steps)


def build_lr_scheduler(
    cfg: CfgNode,
    optimizer: torch.optim.Optimizer,
    plan: RunPlan,
    max_iter: Optional[int] = None,
) -> torch.optim.lr_scheduler.LRScheduler:
    """``SOLVER``'s schedule (:func:`schedule_shape`) through :func:`build_schedule`, over
    ``max_iter`` optimizer steps (default: the plan's ``SOLVER.MAX_ITER``; a trainer whose
    run sets its own length passes that). ``SOLVER.WARMUP_ITERS`` and ``SOLVER.STEPS`` are
    steps whatever the length; ``SOLVER.BASE_LR_END`` is relative to the peak LR."""
    length = plan.max_iter if plan.schedule.ramped or max_iter is None else max_iter
    return build_schedule(cfg, optimizer, schedule_shape(cfg, length, plan.lr.lr), plan, length)
