"""Multigrid in the trainer: the LR schedule of the plan (through largedet's one builder), and the hook that follows
the stages (logging, precise BN at the base shape before each evaluation)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from typing import Iterable, List, Optional

import torch
from detectron2.engine import HookBase
from detectron2.engine.hooks import PreciseBN
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from largedet.solver import RunPlan, build_schedule, with_run_length
from largedet.solver.plan import describe_warmup
from torch import nn

from ..multigrid import MultigridParamScheduler, MultigridPlan

__all__ = ["MultigridHook", "VideoRunPlan", "build_multigrid_lr_scheduler", "multigrid_run_plan", "precise_bn_steps"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoRunPlan(RunPlan):
    """largedet's run plan with the multigrid plan the run trains on (None: no multigrid)."""

    multigrid: Optional[MultigridPlan] = None

    def describe(self, cfg, optimizer_name: str, agvm_parts=None, schedule=None) -> str:
        """largedet's block, with the multigrid plan's warm-up, stages, steps and LR in place
        of ``SOLVER``'s schedule (which multigrid replaces)."""
        if schedule is None and self.multigrid is not None:
            warmup = describe_warmup(cfg, self.warmup_iters, self.lr.lr)
            schedule = f"{warmup}\n{self.multigrid.describe(self.lr.lr)}"
        return super().describe(cfg, optimizer_name, agvm_parts, schedule)


def multigrid_run_plan(plan: RunPlan, cfg, multigrid: MultigridPlan) -> VideoRunPlan:
    """``plan`` with the multigrid plan ``multigrid``, over its steps (its warm-up within
    them: :func:`~largedet.solver.with_run_length`)."""
    fields_of = {f.name: getattr(plan, f.name) for f in fields(plan)}
    return with_run_length(VideoRunPlan(**fields_of, multigrid=multigrid), cfg, multigrid.max_iter)


def build_multigrid_lr_scheduler(cfg, optimizer: torch.optim.Optimizer, plan: VideoRunPlan) -> LRMultiplier:
    """The run's one LR schedule (:func:`~largedet.solver.build_schedule`): each parameter
    group's initial LR (the peak LR of ``SOLVER.LSR`` or ``SOLVER.BASE_LR``) times the
    multigrid plan's relative LR (``plan.multigrid``, :func:`multigrid_run_plan`'s), after the run plan's warm-up
    (from ``WARMUP_FACTOR`` times the first stage's LR) over its steps. The stages sit at
    fixed steps: the warm-up never rescales them. Stepped by Detectron2's ``LRScheduler``
    hook."""
    multigrid: MultigridPlan = plan.multigrid
    shape = MultigridParamScheduler.from_plan(multigrid)
    return build_schedule(cfg, optimizer, shape, plan, multigrid.max_iter, rescale_interval=False)


def precise_bn_steps(max_iter: int, eval_period: int) -> List[int]:
    """The step counts after which :class:`MultigridHook` recomputes BN: each periodic
    evaluation's (``eval_period`` > 0: every multiple below ``max_iter``, as Detectron2's
    ``EvalHook``) and the last step's."""
    periodic = range(eval_period, max_iter, eval_period) if eval_period > 0 else []
    return [*periodic, max_iter]


class MultigridHook(HookBase):
    """Follows the multigrid stages of :class:`MultigridPlan`.

    Before the first step of each stage it logs the stage (shapes, per-device batch
    sizes, LR) and records ``multigrid/stage`` in the event storage. Before each
    evaluation (every ``eval_period`` steps, Detectron2's ``EvalHook`` rule; 0: none
    but the last) and after the last step it recomputes the BN statistics at the base
    shape (fvcore's ``update_bn_stats`` through Detectron2's ``PreciseBN``, on
    ``precise_bn_iters`` batches of that loader), so that the evaluation and the
    checkpoint that follow see statistics of the shape the model is tested at; only
    those read them (training normalizes with each batch's own statistics, and the
    running ones of a later stage replace them). Place it where Detectron2 places
    ``PreciseBN``: after the LR scheduler, before the checkpointer and the evaluation.
    ``precise_bn_s`` and ``precise_bn_passes`` count the seconds and passes of this
    process's precise BN.
    """

    def __init__(
        self,
        plan: MultigridPlan,
        model: nn.Module,
        precise_bn_loader: Iterable,
        precise_bn_iters: int = 200,
        eval_period: int = 0,
    ):
        self.plan = plan
        self._recompute_after = set(precise_bn_steps(plan.max_iter, eval_period))
        # always: the running statistics of a multigrid run average every shape it trained on
        self._precise_bn = PreciseBN(0, model, precise_bn_loader, precise_bn_iters)
        self._stage = -1
        self.precise_bn_s = 0.0
        self.precise_bn_passes = 0

    def before_step(self):
        stage = self.plan.stage_at_iteration(self.trainer.iter)
        if stage.index != self._stage:
            self._stage = stage.index
            epoch, batch = self.plan.position_of_iteration(self.trainer.iter)
            logger.info(
                "Multigrid stage %s from step %d (epoch %d, batch %d): %s per device, LR %.4g",
                "fine-tune" if stage.fine_tuning else stage.index,
                self.trainer.iter,
                epoch,
                batch,
                ", ".join(str(s) for s in stage.short_cycle_shapes),
                self.trainer.optimizer.param_groups[0]["lr"],
            )
        self.trainer.storage.put_scalar("multigrid/stage", stage.index, smoothing_hint=False)

    def after_step(self):
        if self.trainer.iter + 1 in self._recompute_after:
            logger.info("Precise BN at the base shape after step %d", self.trainer.iter + 1)
            start = time.perf_counter()
            self._precise_bn.update_stats()
            comm.synchronize()
            self.precise_bn_s += time.perf_counter() - start
            self.precise_bn_passes += 1
