"""The multigrid schedule (Wu, Girshick, He, Feichtenhofer, Krahenbuhl,
"A Multigrid Method for Efficiently Training Video Models", CVPR 2020).

Training cycles over mini-batch shapes ``clips x frames x crop``. A *long cycle*
walks, once per LR stage of the base schedule, from coarse shapes (few frames,
small crops, many clips, large LR) to the base shape; a *short cycle* inside each
long-cycle stage alternates the crop every iteration. The number of clips per
device is scaled so that ``clips * frames * crop^2`` stays near the base shape's,
which keeps memory per step near constant and lets a coarse shape see the data
set in fewer iterations. A final fine-tuning stage runs at the base shape.

All epochs here are data epochs (one pass over the training set); the stages'
iteration counts follow from the per-device batch size of their shapes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import List, NamedTuple, Sequence, Tuple

from tabulate import tabulate

__all__ = [
    "ClipShape",
    "LRStep",
    "MultigridStage",
    "MultigridSchedule",
    "build_multigrid_schedule",
    "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS",
    "DEFAULT_EPOCH_FACTOR",
]

logger = logging.getLogger(__name__)

# (time, space) factors of the long cycle's shapes, relative to the base (T, S);
# the paper's Sec. 3.2 / Table 1 "default" long cycle.
DEFAULT_LONG_CYCLE_FACTORS: Tuple[Tuple[float, float], ...] = (
    (0.25, math.sqrt(0.5)),
    (0.5, math.sqrt(0.5)),
    (0.5, 1.0),
    (1.0, 1.0),
)
# Crops of the short cycle's first two shapes, as fractions of the base crop S;
# the third shape is the long-cycle stage's own crop.
DEFAULT_SHORT_CYCLE_FACTORS: Tuple[float, float] = (0.5, math.sqrt(0.5))
# Total epochs of the multigrid schedule, as a multiple of the base schedule's.
DEFAULT_EPOCH_FACTOR = 1.5


@dataclass(frozen=True)
class ClipShape:
    """The shape of one mini-batch on one device.

    Attributes:
        num_frames: frames per clip, ``t``.
        crop_size: side of the square spatial crop in pixels, ``s``.
        batch_factor: ``round(T * S^2 / (t * s^2))`` for the base ``(T, S)``: how
            many times more clips than the base batch this shape holds.
        batch_size: clips per device, ``batch_factor * B``.
    """

    num_frames: int
    crop_size: int
    batch_factor: int
    batch_size: int

    def __str__(self) -> str:
        return f"{self.batch_size}x{self.num_frames}x{self.crop_size}"


class LRStep(NamedTuple):
    """From ``start_epoch`` on (until the next step), the LR is ``relative_lr``
    times the base LR."""

    start_epoch: int
    relative_lr: float


@dataclass(frozen=True)
class MultigridStage:
    """One stage of the schedule: epochs ``[start_epoch, end_epoch)`` at one
    long-cycle shape, cycling over ``short_cycle_shapes`` one iteration each.

    Attributes:
        index: position in :attr:`MultigridSchedule.stages`.
        lr_stage: ``k``, the base schedule's LR stage this stage belongs to
            (``K`` for the fine-tuning stage).
        num_frames, crop_size, batch_factor, batch_size: the stage's long-cycle
            shape (see :class:`ClipShape`); ``batch_size`` is per device.
        short_cycle_shapes: the shapes used in turn, one iteration each, starting
            from the first at each epoch; the long-cycle shape is the last. A
            single shape when the short cycle is off.
        avg_batch_factor: mean ``batch_factor`` over ``short_cycle_shapes``.
        epochs: the stage's length after scaling, before rounding the ends.
        start_epoch, end_epoch: the stage covers epochs ``[start, end)``; ends
            are rounded cumulative sums, so a stage can be empty.
        relative_lr: LR relative to the base LR at the stage's start: ``gamma^k``
            times ``batch_factor`` (the linear scaling rule). The fine-tuning
            stage starts at the previous stage's LR and drops to ``gamma^K``
            halfway (see :attr:`MultigridSchedule.lr_steps`).
        fine_tuning: whether this is the final stage at the base shape.
    """

    index: int
    lr_stage: int
    num_frames: int
    crop_size: int
    batch_factor: int
    batch_size: int
    short_cycle_shapes: Tuple[ClipShape, ...]
    avg_batch_factor: float
    epochs: float
    start_epoch: int
    end_epoch: int
    relative_lr: float
    fine_tuning: bool = False

    @property
    def long_cycle_shape(self) -> ClipShape:
        return self.short_cycle_shapes[-1]

    @property
    def num_epochs(self) -> int:
        return self.end_epoch - self.start_epoch


@dataclass(frozen=True)
class MultigridSchedule:
    """A multigrid schedule; see :func:`build_multigrid_schedule`.

    Attributes:
        stages: the long-cycle stages in order, then the fine-tuning stage.
        lr_steps: ``(start_epoch, relative_lr)`` pairs in increasing epoch order;
            the relative LR holds from its start epoch until the next step (or
            ``max_epoch``). Empty intervals are left out.
        max_epoch: total data epochs (the last stage's end epoch).
        base_shape: the base ``B x T x S`` shape (per device).
        iteration_saving: base-schedule iterations over multigrid iterations in
            the long-cycle stages, before the epoch scaling (rule 4).
    """

    stages: Tuple[MultigridStage, ...]
    lr_steps: List[LRStep]
    max_epoch: int
    base_shape: ClipShape
    iteration_saving: float
    long_cycle: bool = True
    short_cycle: bool = True

    def stage_at(self, epoch: float) -> MultigridStage:
        """The stage that trains epoch ``epoch`` (0-based; fractions allowed)."""
        if not 0 <= epoch < self.max_epoch:
            raise ValueError(f"Epoch {epoch} is outside the schedule [0, {self.max_epoch}).")
        return next(s for s in self.stages if s.start_epoch <= epoch < s.end_epoch)

    def relative_lr_at(self, epoch: float) -> float:
        """LR relative to the base LR at ``epoch`` (fractions allowed, so a
        trainer can pass ``epoch + iteration / iterations_per_epoch``)."""
        if not 0 <= epoch < self.max_epoch:
            raise ValueError(f"Epoch {epoch} is outside the schedule [0, {self.max_epoch}).")
        return [step.relative_lr for step in self.lr_steps if step.start_epoch <= epoch][-1]

    def format_table(self) -> str:
        """The schedule as a table for the training log: per stage its epochs,
        shapes (clips x frames x crop per device, in short-cycle order) and LR."""
        rows = []
        for stage in self.stages:
            if stage.fine_tuning:
                lrs = [s for s in self.lr_steps if stage.start_epoch <= s.start_epoch]
                lr = ", ".join(f"{s.relative_lr:.4g} from {s.start_epoch}" for s in lrs)
            else:
                lr = f"{stage.relative_lr:.4g}"
            rows.append(
                (
                    "fine-tune" if stage.fine_tuning else stage.index,
                    stage.lr_stage,
                    f"[{stage.start_epoch}, {stage.end_epoch})",
                    ", ".join(str(s) for s in stage.short_cycle_shapes),
                    f"{stage.avg_batch_factor:.3g}",
                    lr,
                )
            )
        table = tabulate(
            rows,
            headers=["stage", "LR stage", "epochs", "BxTxS per device", "avg factor", "rel. LR"],
            tablefmt="pipe",
        )
        return (
            f"Multigrid schedule (long cycle {'on' if self.long_cycle else 'off'}, short cycle "
            f"{'on' if self.short_cycle else 'off'}), base shape {self.base_shape}, "
            f"{self.max_epoch} epochs, iteration saving {self.iteration_saving:.3g}x:\n{table}"
        )


def _clip_shape(t: int, s: int, base_frames: int, base_crop: int, base_batch: int) -> ClipShape:
    if t < 1 or s < 1:
        raise ValueError(f"Shape {t} frames x {s} pixels is empty; check the cycle factors.")
    factor = round(base_frames * base_crop**2 / (t * s**2))
    if factor < 1:
        raise ValueError(
            f"Shape {t}x{s} is larger than the base {base_frames}x{base_crop} "
            f"(batch factor rounds to 0); cycle factors must be at most 1."
        )
    return ClipShape(t, s, factor, factor * base_batch)


def build_multigrid_schedule(
    base_batch: int,
    base_frames: int,
    base_crop: int,
    lr_steps: Sequence[int],
    max_epoch: int,
    gamma: float = 0.1,
    long_cycle: bool = True,
    short_cycle: bool = True,
    *,
    long_cycle_factors: Sequence[Tuple[float, float]] = DEFAULT_LONG_CYCLE_FACTORS,
    short_cycle_factors: Sequence[float] = DEFAULT_SHORT_CYCLE_FACTORS,
    epoch_factor: float = DEFAULT_EPOCH_FACTOR,
    scale_lr: bool = True,
) -> MultigridSchedule:
    """Build the multigrid schedule for a base step schedule.

    Args:
        base_batch: ``B``, clips per device at the base shape.
        base_frames: ``T``, frames per clip at the base shape.
        base_crop: ``S``, crop side at the base shape.
        lr_steps: ``[0, s_1, ..., s_K]``, the start epochs of the base schedule's
            K + 1 LR stages (LR ``gamma^k`` in ``[s_k, s_{k+1})``); K >= 1.
        max_epoch: the base schedule's length; the last LR stage is
            ``[s_K, max_epoch)``.
        gamma: the base schedule's LR decay per step.
        long_cycle: cycle over ``long_cycle_factors`` in each LR stage; if off,
            each LR stage before ``s_K`` is one stage at the base shape.
        short_cycle: alternate crops every iteration; if off, a stage has one shape.
        long_cycle_factors: ``(time, space)`` factors of the long-cycle shapes.
        short_cycle_factors: crops of the short cycle's first shapes, as
            fractions of the base crop ``S``.
        epoch_factor: the schedule's length as a multiple of ``max_epoch``.
        scale_lr: scale a long-cycle stage's LR by its shape's batch factor (rule 6).

    The rules (all roundings are Python's ``round``, half to even):

    1. A long-cycle stage with factors ``(tf, sf)`` has the shape
       ``t = round(T * tf)``, ``s = round(S * sf)``. With the short cycle it
       alternates, one iteration each, over ``(t, round(S * f))`` for each short
       factor ``f``, then ``(t, s)``.
    2. A shape's batch factor is ``round(T * S^2 / (t * s^2))`` (its per-device
       batch is that times ``B``); a stage's average factor is the mean over its
       shapes.
    3. Each LR stage ``[s_k, s_{k+1})``, ``k < K``, is shared among the
       long-cycle stages in proportion to their average factors, so each gets
       the same number of iterations.
    4. The iteration saving is ``s_K / sum(epochs_i / avg_factor_i)`` over those
       stages. The fine-tuning stage, at the base shape (with its short cycle
       when on), lasts ``(max_epoch - s_K) / saving * avg_factor`` epochs with
       its own average factor; with the default factors, which end at (1, 1),
       that is the last long-cycle stage's.
    5. All lengths are scaled to add up to ``max_epoch * epoch_factor``; a
       stage's end epoch is the rounded cumulative sum of the scaled lengths.
    6. A long-cycle stage's relative LR is ``gamma^k`` times its long-cycle
       shape's batch factor (the linear scaling rule; ``scale_lr=False``: times 1,
       the base shape's LR at every shape). The fine-tuning stage
       runs ``[start, (start + end) // 2)`` at the previous stage's LR, then
       ``gamma^K`` (times the base shape's factor, 1). The short cycle never
       changes the LR.

    The rules apply unchanged with the long cycle off (one base-shape stage per
    LR stage, so the saving is the average factor of the short cycle, or 1) and
    with the short cycle off; pass ``epoch_factor=1`` to keep the base budget.

    Returns:
        The schedule; this function does not log it (log
        :meth:`MultigridSchedule.format_table` once at the start of training).
    """
    steps = list(lr_steps)
    if len(steps) < 2 or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"lr_steps must be [0, s_1, ..., s_K], increasing, K >= 1; got {steps}.")
    if max_epoch <= steps[-1]:
        raise ValueError(f"max_epoch ({max_epoch}) must exceed the last LR step ({steps[-1]}).")
    if min(base_batch, base_frames, base_crop) < 1 or epoch_factor <= 0:
        raise ValueError("base_batch, base_frames, base_crop and epoch_factor must be positive.")
    T, S, B = base_frames, base_crop, base_batch
    K = len(steps) - 1

    def stage_shapes(t: int, s: int) -> Tuple[ClipShape, ...]:
        spatial = [round(S * f) for f in short_cycle_factors] if short_cycle else []
        return tuple(_clip_shape(t, c, T, S, B) for c in spatial + [s])

    cycle = [
        stage_shapes(round(T * tf), round(S * sf))
        for tf, sf in (long_cycle_factors if long_cycle else [(1.0, 1.0)])
    ]
    avg = [sum(sh.batch_factor for sh in shapes) / len(shapes) for shapes in cycle]

    # (lr_stage, shapes, average factor, unscaled epochs) per stage.
    plan = []
    for k in range(K):
        span = steps[k + 1] - steps[k]
        for shapes, a in zip(cycle, avg):
            plan.append((k, shapes, a, span * a / sum(avg)))
    iteration_saving = steps[-1] / sum(epochs / a for _, _, a, epochs in plan)
    ft_shapes = stage_shapes(T, S)
    ft_avg = sum(sh.batch_factor for sh in ft_shapes) / len(ft_shapes)
    plan.append((K, ft_shapes, ft_avg, (max_epoch - steps[-1]) / iteration_saving * ft_avg))

    scale = max_epoch * epoch_factor / sum(epochs for *_, epochs in plan)
    stages = []
    total = 0.0
    for index, (k, shapes, a, epochs) in enumerate(plan):
        total += epochs * scale
        fine_tuning = index == len(plan) - 1
        lr = stages[-1].relative_lr if fine_tuning else gamma**k * (shapes[-1].batch_factor if scale_lr else 1)
        stages.append(
            MultigridStage(
                index=index,
                lr_stage=k,
                num_frames=shapes[-1].num_frames,
                crop_size=shapes[-1].crop_size,
                batch_factor=shapes[-1].batch_factor,
                batch_size=shapes[-1].batch_size,
                short_cycle_shapes=shapes,
                avg_batch_factor=a,
                epochs=epochs * scale,
                start_epoch=stages[-1].end_epoch if stages else 0,
                end_epoch=round(total),
                relative_lr=lr,
                fine_tuning=fine_tuning,
            )
        )
    for stage in stages:
        if stage.num_epochs == 0:
            logger.warning("Multigrid stage %d rounds to zero epochs and is skipped.", stage.index)

    ft = stages[-1]
    steps_out = [LRStep(s.start_epoch, s.relative_lr) for s in stages]
    steps_out.append(LRStep((ft.start_epoch + ft.end_epoch) // 2, gamma**K * ft.batch_factor))
    # Drop steps whose interval is empty: the next step starts at the same
    # epoch, or the schedule has ended.
    steps_out = [
        step
        for step, nxt in zip(steps_out, steps_out[1:] + [None])
        if step.start_epoch < (ft.end_epoch if nxt is None else nxt.start_epoch)
    ]
    return MultigridSchedule(
        stages=tuple(stages),
        lr_steps=steps_out,
        max_epoch=ft.end_epoch,
        base_shape=ClipShape(T, S, 1, B),
        iteration_saving=iteration_saving,
        long_cycle=long_cycle,
        short_cycle=short_cycle,
    )
