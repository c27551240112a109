"""The run plan: every number a run derives from its config, computed once.

:func:`run_plan` reads ``SOLVER`` (and the training set's size) and returns one frozen
:class:`RunPlan`: the batch plan (global batch, devices, micro-batch, K), the batch
schedule (the ramp's stages), the peak LR with its scaling rule, the warm-up, and the
gradient clipping of every step. The trainer builds it once and hands it to what reads it:
the optimizer and LR-schedule builders, the training loop (K, the clip and PMD's clock of
each step), the start-of-run log block and ``run_summary.json``. The study's cells read the
same function.

Clocks. ``SOLVER.MAX_ITER``, ``WARMUP_ITERS``, the LR steps, PMD's period and the clip
windows are counted in steps of the full batch ``SOLVER.IMS_PER_BATCH``. Without a batch
ramp a step is one of them; with a ramp, step ``t`` sits at
``images_before(t) / IMS_PER_BATCH`` on that clock (:meth:`RunPlan.clock`), so each window
is a fixed number of images whatever the ramp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from detectron2.config import CfgNode

from .batch import BatchPlan, BatchSchedule, batch_plan, batch_schedule, check_agvm_estimates
from .lr_scheduler import LRScaling, lr_scaling, scaled_lr, warmup_steps

__all__ = ["ClipWindow", "ParameterClip", "RunPlan", "run_plan"]


@dataclass(frozen=True)
class ClipWindow:
    """Clip the step's total gradient L2 norm to ``max_norm`` while the run's clock (steps of
    the full batch) is in ``[first, end)``."""

    key: str  # the config key it comes from
    max_norm: float
    first: float
    end: float

    def covers(self, clock: float) -> bool:
        return self.first <= clock < self.end


@dataclass(frozen=True)
class ParameterClip:
    """Detectron2's per-parameter clipping (``SOLVER.CLIP_GRADIENTS``, ``CLIP_TYPE`` "value"
    or "norm"), applied at every step after the total-norm clip: each gradient element
    clamped to ``[-value, value]``, or each parameter's gradient scaled to a ``norm_type``-norm
    of at most ``value``."""

    kind: str  # "value" or "norm"
    value: float
    norm_type: float


@dataclass(frozen=True)
class RunPlan:
    """A run's derived numbers (see the module docstring). Frozen: built once, read by all."""

    batch: BatchPlan
    schedule: BatchSchedule
    lr: LRScaling
    max_iter: int  # SOLVER.MAX_ITER: the run's length in steps of the full batch
    # the warm-up's steps of the full batch: SOLVER.WARMUP_ITERS, at most MAX_ITER (with
    # warm-up-stable-decay, at most the steps before the decay: lr_scheduler.warmup_steps)
    warmup_iters: int
    dataset_size: Optional[int] = None  # images of the training set (None: unknown)
    clip_windows: Tuple[ClipWindow, ...] = ()
    parameter_clip: Optional[ParameterClip] = None
    # SOLVER.LSR.RULE: how a batch ramp's smaller batches scale the LR (also with the
    # LSR disabled, where it scales SOLVER.BASE_LR)
    ramp_rule: str = "linear"

    @property
    def total_images(self) -> int:
        """Images the run trains on: ``MAX_ITER x IMS_PER_BATCH``."""
        return self.schedule.total_images

    @property
    def images_trained(self) -> int:
        """Images the run's steps train on: :attr:`total_images`, or with a batch ramp a little
        more (each stage's last step may pass its end by less than one of its batches)."""
        return self.schedule.images_before(self.schedule.total_steps)

    @property
    def total_steps(self) -> int:
        """Optimizer steps: ``MAX_ITER``, or the batch ramp's (more, smaller steps)."""
        return self.schedule.total_steps

    @property
    def warmup_images(self) -> int:
        return self.warmup_iters * self.batch.global_batch

    @property
    def epochs(self) -> Optional[float]:
        return self.total_images / self.dataset_size if self.dataset_size else None

    def clock(self, step: int) -> float:
        """Step ``step``'s position in steps of the full batch (its own index without a ramp)."""
        return self.schedule.clock(step)

    def accumulation_at(self, step: int) -> int:
        """K of optimizer step ``step``: micro-batches per device."""
        return self.schedule.stage_at(step).accumulation

    def batch_at(self, step: int) -> int:
        """The global batch of optimizer step ``step``."""
        return self.schedule.batch_at(step)

    def lr_factor(self, batch: int) -> float:
        """What a step of global batch ``batch`` multiplies the peak LR by: the scaling rule's
        ratio to the full batch (1 at ``IMS_PER_BATCH``)."""
        return scaled_lr(1.0, self.batch.global_batch, batch, self.ramp_rule)

    def clip_at(self, step: int) -> Optional[float]:
        """The total-norm bound of step ``step``: the smallest of the windows that cover its
        clock, or None."""
        clock = self.clock(step)
        bounds = [w.max_norm for w in self.clip_windows if w.covers(clock)]
        return min(bounds) if bounds else None

    def describe_clipping(self) -> Optional[str]:
        """One line on the run's gradient clipping, or None when it clips nothing."""
        parts = []
        for w in self.clip_windows:
            span = "every step" if math.isinf(w.end) and w.first <= 0 else (
                f"steps {w.first:g}-{w.end:g} of the full batch"
            )
            parts.append(f"total norm <= {w.max_norm:g} at {span} ({w.key})")
        clip = self.parameter_clip
        if clip is not None:
            what = (
                f"each element to [-{clip.value:g}, {clip.value:g}]"
                if clip.kind == "value"
                else f"each parameter's {clip.norm_type:g}-norm to {clip.value:g}"
            )
            parts.append(f"{what} (SOLVER.CLIP_GRADIENTS)")
        return "gradient clipping: " + "; ".join(parts) if parts else None


def _window(key: str, max_norm: float, warmup_iters: int, before: int, after: int) -> Tuple[ClipWindow, ...]:
    if max_norm <= 0:
        return ()
    return (ClipWindow(key, float(max_norm), max(warmup_iters - before, 0), warmup_iters + after),)


def clip_rules(cfg: CfgNode) -> Tuple[Tuple[ClipWindow, ...], Optional[ParameterClip]]:
    """The clipping ``cfg`` asks for, in one place: ``SOLVER.WARMUP_CLIP`` and
    ``SOLVER.AGVM.CLIP_*`` (windows around the end of warm-up), and Detectron2's
    ``SOLVER.CLIP_GRADIENTS``: "full_model" with the L2 norm is a window over the whole run,
    "value" and "norm" a :class:`ParameterClip`. Raises ``ValueError`` naming the key for a
    "full_model" clip of another norm (the loop clips the L2 norm) and an unknown type."""
    solver = cfg.SOLVER
    warmup = solver.WARMUP_ITERS
    windows = _window("SOLVER.WARMUP_CLIP", solver.WARMUP_CLIP.MAX_NORM, warmup, *solver.WARMUP_CLIP.ITERS)
    if solver.AGVM.ENABLED:
        windows += _window("SOLVER.AGVM.CLIP_MAX_NORM", solver.AGVM.CLIP_MAX_NORM, warmup, *solver.AGVM.CLIP_ITERS)
    parameter = None
    clip = solver.CLIP_GRADIENTS
    if clip.ENABLED:
        kind, value, norm_type = clip.CLIP_TYPE, float(clip.CLIP_VALUE), float(clip.NORM_TYPE)
        if kind == "full_model":
            if norm_type != 2.0:
                raise ValueError(
                    f"SOLVER.CLIP_GRADIENTS.NORM_TYPE must be 2.0 with CLIP_TYPE full_model (the "
                    f"training loop clips the total L2 norm), got {norm_type:g}"
                )
            windows += (ClipWindow("SOLVER.CLIP_GRADIENTS", value, 0, math.inf),)
        elif kind in ("value", "norm"):
            parameter = ParameterClip(kind, value, norm_type)
        else:
            raise ValueError(
                f"SOLVER.CLIP_GRADIENTS.CLIP_TYPE must be one of 'value', 'norm', 'full_model', got {kind!r}"
            )
    return windows, parameter


def run_plan(cfg: CfgNode, world_size: int, dataset_size: Optional[int] = None) -> RunPlan:
    """The :class:`RunPlan` of ``cfg`` on ``world_size`` processes for a training set of
    ``dataset_size`` images (needed by a batch ramp, whose stages end at epochs).

    Raises :class:`~largedet.solver.batch.BatchArithmeticError` for a global batch or a
    ramp that does not split into whole micro-batches, ``ValueError`` for AGVM without two
    gradient estimates at some stage, an LSR or a clip that cannot be applied."""
    solver = cfg.SOLVER
    batch = batch_plan(cfg, world_size)
    ramp = solver.BATCH_RAMP
    if ramp.BATCHES and not dataset_size:
        raise ValueError("SOLVER.BATCH_RAMP needs the training set's size (a ResumableLoader's)")
    schedule = batch_schedule(batch, solver.MAX_ITER, ramp.BATCHES, ramp.EPOCHS, dataset_size)
    if solver.AGVM.ENABLED:
        for stage in schedule.stages:
            check_agvm_estimates(stage.accumulation, world_size)
    windows, parameter = clip_rules(cfg)
    return RunPlan(
        batch=batch,
        schedule=schedule,
        lr=lr_scaling(cfg),
        max_iter=solver.MAX_ITER,
        warmup_iters=warmup_steps(cfg, solver.MAX_ITER),
        dataset_size=dataset_size,
        clip_windows=windows,
        parameter_clip=parameter,
        ramp_rule=solver.LSR.RULE,
    )
