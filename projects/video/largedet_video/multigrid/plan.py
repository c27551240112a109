"""A multigrid schedule laid out in optimizer steps, and its LR as a param scheduler.

The schedule (:func:`largedet_video.multigrid.schedule.build_multigrid_schedule`) counts data epochs; a trainer counts
optimizer steps. Each epoch of a stage is a fixed number of per-device batches (those
of :class:`MultigridBatchSampler`, the same on every rank), and an optimizer step takes
``accumulation`` consecutive batches of this stream, which runs on across epoch
boundaries. :class:`MultigridPlan` maps between the two: the run's length, the epoch
and short-cycle position of any step, the steps at which the LR changes and at which
stages end.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from fvcore.common.param_scheduler import ParamScheduler
from tabulate import tabulate

from .sampler import MultigridBatchSampler
from .schedule import ClipShape, MultigridSchedule, MultigridStage

__all__ = ["MultigridPlan", "MultigridParamScheduler"]


@dataclass(frozen=True)
class MultigridPlan:
    """A :class:`MultigridSchedule` on ``num_samples`` training clips and
    ``world_size`` devices, in optimizer steps of ``accumulation`` batches.

    Attributes:
        schedule: the epoch schedule (per-device shapes and batch sizes).
        num_samples: training clips per epoch (all devices).
        world_size: devices.
        accumulation: per-device batches per optimizer step (largedet's K).
        global_batch: base-shape clips per optimizer step (``SOLVER.IMS_PER_BATCH``).
        epoch_batches: per-device batches in each epoch ``0 .. max_epoch - 1``.
        base_max_iter: optimizer steps of the base schedule, for comparison.
    """

    schedule: MultigridSchedule
    num_samples: int
    world_size: int
    accumulation: int
    global_batch: int
    epoch_batches: Tuple[int, ...]
    base_max_iter: int = 0

    @classmethod
    def create(
        cls,
        schedule: MultigridSchedule,
        num_samples: int,
        world_size: int = 1,
        accumulation: int = 1,
        global_batch: int = 0,
        base_max_iter: int = 0,
    ) -> "MultigridPlan":
        """Count the batches of every epoch as :class:`MultigridBatchSampler`
        (``drop_last``) yields them; raises ``ValueError`` when a stage's epoch has
        no whole batch (a data set smaller than one of its batches)."""
        sampler = MultigridBatchSampler(
            num_samples, schedule, seed=0, rank=0, world_size=world_size
        )
        per_stage = {s.index: sampler.num_batches(s) for s in schedule.stages if s.num_epochs}
        for stage in schedule.stages:
            if stage.num_epochs and per_stage[stage.index] == 0:
                raise ValueError(
                    f"Multigrid stage {stage.index} ({stage.long_cycle_shape} per device) has no "
                    f"whole batch in an epoch of {num_samples} clips on {world_size} device(s)."
                )
        epochs = tuple(per_stage[schedule.stage_at(e).index] for e in range(schedule.max_epoch))
        return cls(
            schedule,
            num_samples,
            world_size,
            accumulation,
            global_batch or schedule.base_shape.batch_size * world_size * accumulation,
            epochs,
            base_max_iter,
        )

    @property
    def _epoch_starts(self) -> List[int]:
        return [0, *itertools.accumulate(self.epoch_batches)]

    @property
    def total_batches(self) -> int:
        return sum(self.epoch_batches)

    @property
    def max_iter(self) -> int:
        """Optimizer steps of the whole run (a last partial step is dropped)."""
        return self.total_batches // self.accumulation

    def locate(self, batch: int) -> Tuple[int, int]:
        """``(epoch, batch within the epoch)`` of per-device batch ``batch`` (0-based);
        ``(max_epoch, 0)`` for the end of the stream."""
        if not 0 <= batch <= self.total_batches:
            raise ValueError(f"Batch {batch} is outside the run's {self.total_batches} batches.")
        starts = self._epoch_starts
        epoch = bisect.bisect_right(starts, batch) - 1
        return epoch, batch - starts[epoch]

    def position_of_iteration(self, iteration: int) -> Tuple[int, int]:
        """``(epoch, batch within the epoch)`` where optimizer step ``iteration`` starts;
        the batch within the epoch is also the short-cycle position counted from the
        epoch's first batch."""
        return self.locate(iteration * self.accumulation)

    def shapes_of_iteration(self, iteration: int) -> List[Tuple[ClipShape, bool]]:
        """The per-device batches of optimizer step ``iteration``, in order: each one's
        shape (its short-cycle position in its epoch's stage) and whether it is the first
        batch of an epoch (where the loader starts the epoch's pass)."""
        out = []
        for batch in range(iteration * self.accumulation, (iteration + 1) * self.accumulation):
            epoch, position = self.locate(batch)
            shapes = self.schedule.stage_at(epoch).short_cycle_shapes
            out.append((shapes[position % len(shapes)], position == 0))
        return out

    def stage_at_iteration(self, iteration: int) -> MultigridStage:
        return self.schedule.stage_at(self.position_of_iteration(iteration)[0])

    def _first_iteration_from(self, epoch: int) -> int:
        """The first optimizer step that starts at or after the start of ``epoch``."""
        return -(-self._epoch_starts[epoch] // self.accumulation)

    def first_step_of_epoch(self, epoch: int) -> int:
        """The first optimizer step that starts at or after the start of ``epoch`` (a warm-up
        of ``epoch`` epochs lasts this many steps); ``max_iter`` from the last epoch on."""
        return min(self._first_iteration_from(min(epoch, self.schedule.max_epoch)), self.max_iter)

    def lr_milestones(self) -> List[Tuple[int, float]]:
        """``(first step, relative LR)`` of each of the schedule's LR steps; the LR of a
        step is that of the epoch its first batch belongs to."""
        out: List[Tuple[int, float]] = []
        for step in self.schedule.lr_steps:
            it = self._first_iteration_from(step.start_epoch)
            if out and out[-1][0] == it:
                out.pop()
            out.append((it, step.relative_lr))
        return out

    def stage_end_iterations(self) -> List[Tuple[MultigridStage, int]]:
        """``(stage, n)`` for each non-empty stage: after ``n`` optimizer steps the
        stage's last batch has been trained on."""
        return [
            (s, min(-(-self._epoch_starts[s.end_epoch] // self.accumulation), self.max_iter))
            for s in self.schedule.stages
            if s.num_epochs
        ]

    def describe(self, base_lr: float) -> str:
        """The table logged at the start of training: per stage its epochs, shapes
        (clips x frames x crop per device, in short-cycle order), optimizer steps and
        LR (``base_lr`` times the relative LR)."""
        rows = []
        start = 0
        for stage, end in self.stage_end_iterations():
            lrs = [
                f"{base_lr * lr:.4g}" + (f" from step {it}" if stage.fine_tuning else "")
                for it, lr in self.lr_milestones()
                if start <= it < end
            ]
            rows.append(
                (
                    "fine-tune" if stage.fine_tuning else stage.index,
                    f"[{stage.start_epoch}, {stage.end_epoch})",
                    ", ".join(str(s) for s in stage.short_cycle_shapes),
                    f"{stage.avg_batch_factor:.3g}",
                    f"[{start}, {end})",
                    ", ".join(lrs)
                    or f"{base_lr * self.schedule.relative_lr_at(stage.start_epoch):.4g}",
                )
            )
            start = end
        table = tabulate(
            rows,
            headers=["stage", "epochs", "BxTxS per device", "avg factor", "steps", "LR"],
            tablefmt="pipe",
        )
        s = self.schedule
        base = (
            f"; the base schedule: {self.base_max_iter} steps, {self.base_max_iter / self.max_iter:.2f}x more"
            if self.base_max_iter
            else ""
        )
        return (
            f"Multigrid (long cycle {'on' if s.long_cycle else 'off'}, short cycle "
            f"{'on' if s.short_cycle else 'off'}): base shape {s.base_shape} per device, "
            f"{self.num_samples} clips per epoch on {self.world_size} device(s), "
            f"{self.accumulation} batch(es) per optimizer step; {s.max_epoch} epochs in "
            f"{self.max_iter} optimizer steps{base}:\n{table}"
        )


class MultigridParamScheduler(ParamScheduler):
    """The relative LR of a :class:`MultigridPlan` as a param scheduler: at
    ``where = step / max_iter`` it is the relative LR of the last milestone at or
    before ``step``. Wrapped in Detectron2's ``LRMultiplier`` (and
    ``WarmupParamScheduler``), it is the run's one LR schedule."""

    def __init__(self, milestones: Sequence[Tuple[int, float]], max_iter: int):
        if not milestones or milestones[0][0] != 0:
            raise ValueError(f"Milestones must start at step 0, got {list(milestones)}.")
        self._steps = [it for it, _ in milestones]
        self._values = [lr for _, lr in milestones]
        self._max_iter = max_iter

    @classmethod
    def from_plan(cls, plan: MultigridPlan) -> "MultigridParamScheduler":
        return cls(plan.lr_milestones(), plan.max_iter)

    def __call__(self, where: float) -> float:
        # LRMultiplier passes step / max_iter: round back to the integer step.
        step = round(where * self._max_iter)
        return self._values[bisect.bisect_right(self._steps, step) - 1]
