"""The learning rate: the linear scaling rule (LSR) on top of Detectron2's warmup schedule.

LargeDet's first ingredient (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): when
the global batch B grows k times over a reference batch, the peak LR grows k times
("linear") or sqrt(k) times ("sqrt", for adaptive optimizers), starting from a
reference LR known to work (``SOLVER.LSR``), and training starts with a warmup from
``WARMUP_FACTOR x LR`` over ``SOLVER.WARMUP_ITERS`` optimizer steps.

Who computes and who writes the LR, once each:

- :func:`lr_scaling` computes the peak LR from the config (``SOLVER.BASE_LR``, or with
  ``SOLVER.LSR.ENABLED`` the rule's LR, which replaces it); the run plan
  (:func:`largedet.solver.plan.run_plan`) calls it once and carries the result
  (:class:`LRScaling`) to what needs it: the optimizer's builder, the schedule, the log
  block and the run summary;
- :func:`with_scaled_lr` is the one place that writes it into a config: the transient copy
  that the optimizer registry's builders read (their contract is Detectron2's, ``(cfg,
  model)`` reading ``SOLVER.BASE_LR``); the parameter groups get it (biases times
  ``SOLVER.BIAS_LR_FACTOR``, as in Detectron2);
- the schedule multiplies each group's initial LR: one Detectron2 ``LRMultiplier`` over a
  ``WarmupParamScheduler`` (:func:`build_lr_scheduler`), stepped once per
  optimizer step by Detectron2's ``LRScheduler`` hook; besides its steps, only
  :func:`rescale_schedule` (the divergence guard's rollback) writes the LR of a running
  schedule.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
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

__all__ = [
    "LR_SCHEDULES",
    "LSR_RULES",
    "ImageClockLRMultiplier",
    "LRScaling",
    "build_lr_scheduler",
    "lr_multiplier",
    "lr_scaling",
    "rescale_schedule",
    "scaled_lr",
    "warmup_steps",
    "with_scaled_lr",
]

logger = logging.getLogger(__name__)

#: SOLVER.LR_SCHEDULER_NAME values: Detectron2's three and warm-up-stable-decay
LR_SCHEDULES = ("WarmupMultiStepLR", "WarmupCosineLR", "WarmupStepWithFixedGammaLR", "WarmupStableDecayLR")

#: SOLVER.LSR.RULE -> the factor applied to REFERENCE_LR, as a function of B / REFERENCE_BATCH.
LSR_RULES = {"linear": lambda ratio: ratio, "sqrt": math.sqrt}


def scaled_lr(reference_lr: float, reference_batch: int, batch: int, rule: str) -> float:
    """The linear scaling rule's LR at ``batch``: ``reference_lr`` (right at
    ``reference_batch``) times ``batch / reference_batch`` ("linear") or its square root
    ("sqrt"). The one formula: the trainer's peak LR (:func:`lr_scaling`), the LR of each
    step of a batch ramp and the study's cells all read it."""
    return reference_lr * LSR_RULES[rule](batch / reference_batch)


@dataclass(frozen=True)
class LRScaling:
    """The peak learning rate of a run and where it comes from."""

    lr: float  # the peak LR: what the optimizer is built with, reached at the end of warmup
    rule: str  # "linear", "sqrt", or "none" (LSR disabled: lr is SOLVER.BASE_LR)
    global_batch: int  # SOLVER.IMS_PER_BATCH
    reference_lr: float = 0.0
    reference_batch: int = 0

    def describe(self) -> str:
        if self.rule == "none":
            return f"LR {self.lr:g} (SOLVER.BASE_LR; linear scaling rule disabled)"
        ratio = f"{self.global_batch} / {self.reference_batch}"
        factor = ratio if self.rule == "linear" else f"sqrt({ratio})"
        return (
            f"LR {self.lr:g} = {self.rule} scaling rule: reference LR {self.reference_lr:g} "
            f"at batch {self.reference_batch} x {factor} (replaces SOLVER.BASE_LR)"
        )


def lr_scaling(cfg: CfgNode) -> LRScaling:
    """The peak LR that ``cfg`` asks for: ``SOLVER.BASE_LR``, or the LSR's when enabled.
    The values of ``SOLVER.LSR`` are checked where every key's are, against their declared
    rules (:func:`largedet.config.validate.check_values`, before launch and when a trainer
    is built)."""
    solver = cfg.SOLVER
    if not solver.LSR.ENABLED:
        return LRScaling(lr=float(solver.BASE_LR), rule="none", global_batch=solver.IMS_PER_BATCH)
    lsr = solver.LSR
    return LRScaling(
        lr=scaled_lr(lsr.REFERENCE_LR, lsr.REFERENCE_BATCH, solver.IMS_PER_BATCH, lsr.RULE),
        rule=lsr.RULE,
        global_batch=solver.IMS_PER_BATCH,
        reference_lr=float(lsr.REFERENCE_LR),
        reference_batch=lsr.REFERENCE_BATCH,
    )


def with_scaled_lr(cfg: CfgNode, scaling: Optional[LRScaling] = None) -> CfgNode:
    """A copy of ``cfg`` whose ``SOLVER.BASE_LR`` is the peak LR ``scaling`` (the run plan's;
    default :func:`lr_scaling` of ``cfg``).

    For the builders that read ``SOLVER.BASE_LR`` (``largedet.solver.build_optimizer``,
    Detectron2's LR schedules); the copy is handed to them and not kept. Returns ``cfg``
    itself when the LSR is disabled.
    """
    if not cfg.SOLVER.LSR.ENABLED:
        return cfg
    scaled = cfg.clone()
    scaled.defrost()
    scaled.SOLVER.BASE_LR = (scaling or lr_scaling(cfg)).lr
    scaled.freeze()
    return scaled


def warmup_steps(cfg: CfgNode, max_iter: int) -> int:
    """The warm-up's length in optimizer steps of a ``max_iter``-step run:
    ``SOLVER.WARMUP_ITERS``, at most the run and, with ``WarmupStableDecayLR``, at most the
    steps before the decay starts (``floor(WSD.DECAY_START x max_iter)``). Detectron2's
    warm-up ends at the shape's value where it ends; one that reached into the decay would
    end below the peak LR (a short run with ``WARMUP_ITERS >= MAX_ITER`` would end at
    ``BASE_LR_END`` and never train at the peak), so it is shortened to end at the peak."""
    solver = cfg.SOLVER
    steps = min(solver.WARMUP_ITERS, max_iter)
    if solver.LR_SCHEDULER_NAME == "WarmupStableDecayLR":
        steps = min(steps, math.floor(solver.WSD.DECAY_START * max_iter))
    return steps


def lr_multiplier(cfg: CfgNode, max_iter: int, peak_lr: float) -> ParamScheduler:
    """The schedule's multiplier of the peak LR as a function of the run's progress in
    [0, 1): Detectron2's warm-up (``WARMUP_FACTOR``, ``WARMUP_ITERS``, ``WARMUP_METHOD``)
    around ``SOLVER.LR_SCHEDULER_NAME``'s shape over ``max_iter`` steps, as Detectron2's
    ``build_lr_scheduler`` makes it (``WarmupMultiStepLR``, ``WarmupCosineLR``,
    ``WarmupStepWithFixedGammaLR``), or warm-up-stable-decay (``WarmupStableDecayLR``):
    1 until ``SOLVER.WSD.DECAY_START``, then linear to ``BASE_LR_END / peak_lr``. ``peak_lr``:
    the run's peak LR (:func:`lr_scaling`'s), which the cosine and the warm-up-stable-decay
    shapes end at ``SOLVER.BASE_LR_END`` from. The warm-up lasts :func:`warmup_steps`."""
    solver = cfg.SOLVER
    name = solver.LR_SCHEDULER_NAME
    end_value = solver.BASE_LR_END / peak_lr if peak_lr else 0.0
    if name == "WarmupMultiStepLR":
        steps = [x for x in solver.STEPS if x <= max_iter]
        if len(steps) != len(solver.STEPS):
            logger.warning("SOLVER.STEPS %s past the run's %d steps are ignored", tuple(solver.STEPS), max_iter)
        shape = MultiStepParamScheduler(
            values=[solver.GAMMA**k for k in range(len(steps) + 1)],
            milestones=steps,
            num_updates=max_iter,
        )
    elif name == "WarmupCosineLR":
        shape = CosineParamScheduler(1, end_value)
    elif name == "WarmupStepWithFixedGammaLR":
        shape = StepWithFixedGammaParamScheduler(
            base_value=1.0, gamma=solver.GAMMA, num_decays=solver.NUM_DECAYS, num_updates=max_iter
        )
    elif name == "WarmupStableDecayLR":
        start = solver.WSD.DECAY_START  # in (0, 1): its declared rule
        shape = CompositeParamScheduler(
            [ConstantParamScheduler(1.0), LinearParamScheduler(1.0, end_value)],
            lengths=[start, 1.0 - start],
            interval_scaling=["rescaled", "rescaled"],
        )
    else:
        raise ValueError(f"SOLVER.LR_SCHEDULER_NAME: unknown LR schedule {name!r}; one of {LR_SCHEDULES}")
    return WarmupParamScheduler(
        shape,
        solver.WARMUP_FACTOR,
        warmup_steps(cfg, max_iter) / max_iter,
        solver.WARMUP_METHOD,
        solver.RESCALE_INTERVAL,
    )


class ImageClockLRMultiplier(LRMultiplier):
    """Detectron2's ``LRMultiplier`` for a run whose global batch changes (a batch ramp,
    :class:`~largedet.solver.batch.BatchSchedule`, in the run plan ``plan``): at optimizer
    step t the LR is each group's peak LR x the schedule's multiplier at the run's progress
    in images (``images_before(t) / total_images``) x the scaling rule's ratio of step t's
    batch to the full batch (:meth:`~largedet.solver.plan.RunPlan.lr_factor`).
    ``last_epoch`` counts optimizer steps, as before."""

    def __init__(self, optimizer, multiplier: ParamScheduler, plan, last_iter: int = -1):
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


def build_lr_scheduler(
    cfg: CfgNode,
    optimizer: torch.optim.Optimizer,
    max_iter: int | None = None,
    plan=None,
) -> torch.optim.lr_scheduler.LRScheduler:
    """The warm-up + schedule (:func:`lr_multiplier`) around the peak LR, as one Detectron2
    ``LRMultiplier`` over ``max_iter`` optimizer steps (default ``SOLVER.MAX_ITER``; the
    trainer gives its run length, :meth:`largedet.engine.Trainer.run_length`).

    It multiplies each parameter group's initial LR (which the optimizer got from
    :func:`with_scaled_lr`) by the schedule at each step; ``SOLVER.BASE_LR_END`` is relative
    to the peak LR, the run plan's (``plan``; without one, :func:`lr_scaling` of ``cfg``).
    ``SOLVER.WARMUP_ITERS`` and ``SOLVER.STEPS`` are steps whatever the length. With a
    ``plan`` whose batch ramps, an :class:`ImageClockLRMultiplier`: the schedule over
    ``SOLVER.MAX_ITER`` steps of the full batch followed in images, times
    ``SOLVER.LSR.RULE``'s factor at each step's batch.
    """
    peak_lr = (plan.lr if plan is not None else lr_scaling(cfg)).lr
    if plan is not None and plan.schedule.ramped:
        multiplier = lr_multiplier(cfg, cfg.SOLVER.MAX_ITER, peak_lr)
        return ImageClockLRMultiplier(optimizer, multiplier, plan)
    max_iter = cfg.SOLVER.MAX_ITER if max_iter is None else max_iter
    return LRMultiplier(optimizer, multiplier=lr_multiplier(cfg, max_iter, peak_lr), max_iter=max_iter)
