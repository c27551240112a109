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
from dataclasses import dataclass, replace
from typing import Optional, Tuple

from detectron2.config import CfgNode

from ..config import amp_dtype
from .batch import BatchPlan, BatchSchedule, batch_plan, batch_schedule, check_agvm_estimates

__all__ = [
    "LSR_RULES",
    "ClipWindow",
    "LRScaling",
    "ParameterClip",
    "RunPlan",
    "StepPlan",
    "lr_scaling",
    "describe_warmup",
    "run_plan",
    "scaled_lr",
    "warmup_steps",
    "with_run_length",
]


# --- the peak LR: the linear scaling rule --------------------------------------------------

#: SOLVER.LSR.RULE -> the factor applied to REFERENCE_LR, as a function of B / REFERENCE_BATCH
#: (the rule names are the key's, :data:`largedet.config.defaults.LSR_RULES`).
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
    is built). Called once per run, by :func:`run_plan`."""
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




# --- gradient clipping ---------------------------------------------------------------------



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
class StepPlan:
    """What one optimizer step of the run plan asks of the training loop
    (:meth:`RunPlan.step_at`, :meth:`largedet.engine.train_loop.AccumulationTrainer.set_step`)."""

    accumulation: int  # K: micro-batches per device
    clip_max_norm: Optional[float] = None  # the step's total-norm bound (None: no clip)
    clock: Optional[float] = None  # with a batch ramp: PMD's clock, steps of the full batch


@dataclass(frozen=True)
class RunPlan:
    """A run's derived numbers (see the module docstring). Frozen: built once, read by all."""

    batch: BatchPlan
    schedule: BatchSchedule
    lr: LRScaling
    max_iter: int  # SOLVER.MAX_ITER: the run's length in steps of the full batch
    # the warm-up's steps of the full batch: SOLVER.WARMUP_ITERS, at most MAX_ITER (with
    # warm-up-stable-decay, at most the steps before the decay: warmup_steps)
    warmup_iters: int
    dataset_size: Optional[int] = None  # images of the training set (None: unknown)
    clip_windows: Tuple[ClipWindow, ...] = ()
    parameter_clip: Optional[ParameterClip] = None
    # SOLVER.LSR.RULE: how a batch ramp's smaller batches scale the LR (also with the
    # LSR disabled, where it scales SOLVER.BASE_LR)
    ramp_rule: str = "linear"
    # the run's length in optimizer steps where an LR schedule of its own sets it (the video
    # project's multigrid plan: with_run_length); None: total_steps
    run_steps: Optional[int] = None

    @property
    def run_length(self) -> int:
        """The run's length in optimizer steps: where the training loop stops, what the
        writers' ETA counts down and the steps the LR schedule spans. :attr:`total_steps`,
        or the steps :func:`with_run_length` gave."""
        return self.total_steps if self.run_steps is None else self.run_steps

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

    def step_at(self, step: int) -> StepPlan:
        """What optimizer step ``step`` asks of the training loop: its K, its total-norm clip
        and, with a batch ramp, PMD's clock."""
        return StepPlan(
            accumulation=self.accumulation_at(step),
            clip_max_norm=self.clip_at(step),
            clock=self.clock(step) if self.schedule.ramped else None,
        )

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

    def describe(
        self,
        cfg: CfgNode,
        optimizer_name: str,
        agvm_parts: Optional[str] = None,
        schedule: Optional[str] = None,
    ) -> str:
        """The block of derived numbers logged at the start of training, all read from this
        plan (``cfg`` is the config it was built from, for the names of what it describes).
        ``agvm_parts``: the AGVM parts with their parameter counts (default: the part names
        of the config); ``schedule``: what replaces the lines of the ``SOLVER`` schedule
        (warm-up, LR steps, iterations and epochs), for a trainer that runs another one."""
        solver, batch, scaling = cfg.SOLVER, self.batch, self.lr
        epochs = (
            f"{self.epochs:.2f} epochs of {self.dataset_size} images"
            if self.dataset_size
            else "epochs unknown"
        )
        if amp_dtype(cfg) is not None:
            amp = f"AMP {solver.AMP.PRECISION}"
        elif solver.AMP.ENABLED:  # SOLVER.AMP.NATIVE_ONLY on a device without it
            amp = (
                f"full precision: {cfg.MODEL.DEVICE} has no native {solver.AMP.PRECISION} "
                "(SOLVER.AMP.NATIVE_ONLY)"
            )
        else:
            amp = "full precision"
        lines = [
            "Large-batch run:",
            f"  world size {batch.world_size}; global batch {batch.global_batch} (SOLVER.IMS_PER_BATCH); "
            f"{batch.per_device} image(s) per device per pass; {batch.accumulation} accumulation step(s) "
            f"per optimizer step; {amp}",
            f"  optimizer {optimizer_name} (SOLVER.OPTIMIZER {solver.OPTIMIZER}); {scaling.describe()}",
        ]
        if schedule is None:
            lines.append(f"  {describe_warmup(cfg, self.warmup_iters, scaling.lr, self.warmup_images)}; "
                         f"{_describe_shape(solver)}")  # fmt: skip
            lines.append(
                f"  {self.max_iter} iterations x {batch.global_batch} = {self.total_images} images = {epochs}"
            )
        else:
            lines.extend("  " + line for line in schedule.splitlines())
        if self.schedule.ramped:
            lines.append("  " + self.schedule.describe(self.dataset_size))
        clipping = self.describe_clipping()
        if clipping:
            lines.append("  " + clipping)
        if solver.AGVM.ENABLED:
            lines.append("  " + _describe_agvm(cfg, batch, agvm_parts))
        return "\n".join(lines)


# --- the start-of-run block ---------------------------------------------------------------

def describe_warmup(cfg, warmup_iters: int, peak_lr: float, warmup_images: Optional[int] = None) -> str:
    """The warm-up's part of the start-of-run block: ``warmup_iters`` steps of the full batch
    (``warmup_images`` images) from ``WARMUP_FACTOR x peak_lr`` to ``peak_lr``; where that is
    shorter than ``SOLVER.WARMUP_ITERS`` (:func:`~largedet.solver.warmup_steps`), why."""
    solver = cfg.SOLVER
    shortened = ""
    if warmup_iters < solver.WARMUP_ITERS:
        shortened = f" (SOLVER.WARMUP_ITERS {solver.WARMUP_ITERS} shortened: it ends at the peak LR within the run"
        if solver.LR_SCHEDULER_NAME == "WarmupStableDecayLR":
            shortened += f", before the decay at {solver.WSD.DECAY_START:g} of it"
        shortened += ")"
    if not warmup_iters:
        return "no warmup" + shortened
    images = f" ({warmup_images} images)" if warmup_images else ""
    return (
        f"{solver.WARMUP_METHOD} warmup over {warmup_iters} iterations{images} from "
        f"{solver.WARMUP_FACTOR:g} x LR = {solver.WARMUP_FACTOR * peak_lr:g} to {peak_lr:g}{shortened}"
    )


def _describe_shape(solver) -> str:
    name = solver.LR_SCHEDULER_NAME
    if name == "WarmupStableDecayLR":
        return (
            f"WarmupStableDecayLR: the peak LR until {solver.WSD.DECAY_START:g} of the run, "
            f"then linear to {solver.BASE_LR_END:g}"
        )
    if name == "WarmupCosineLR":
        return f"WarmupCosineLR: cosine from the peak LR to {solver.BASE_LR_END:g} at the run's end"
    if name == "WarmupStepWithFixedGammaLR":
        return f"WarmupStepWithFixedGammaLR: x {solver.GAMMA:g} at {solver.NUM_DECAYS} evenly spaced steps"
    if solver.STEPS:  # WarmupMultiStepLR, a LazyConfig's schedule with milestones
        return f"{name} with steps {tuple(solver.STEPS)}"
    return name


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _describe_agvm(cfg, batch: BatchPlan, parts: Optional[str]) -> str:
    agvm = cfg.SOLVER.AGVM
    if batch.accumulation >= 2:
        k, h = batch.accumulation, batch.accumulation // 2
        halves = f"micro-batches {_span(1, h)} vs {_span(h + 1, k)} of each step"
    else:
        w, h = batch.world_size, batch.world_size // 2
        halves = f"processes {_span(0, h - 1)} vs {_span(h, w - 1)}"
    if parts is None:
        parts = ", ".join(dict.fromkeys(name for name, _ in agvm.GROUPS))
    return (
        f"AGVM: parts {parts} aligned with {agvm.REFERENCE}; phi every {agvm.PERIOD} steps from "
        f"iteration {agvm_start_iter(cfg)} on {halves}; clamp {tuple(agvm.CLAMP)}, "
        f"momentum {agvm.MOMENTUM:g}"
    )


def agvm_start_iter(cfg: CfgNode) -> int:
    """``SOLVER.AGVM.START_ITER``, with -1 resolved to ``SOLVER.WARMUP_ITERS``."""
    start = cfg.SOLVER.AGVM.START_ITER
    return cfg.SOLVER.WARMUP_ITERS if start == -1 else start


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


def with_run_length(plan: RunPlan, cfg: CfgNode, steps: int) -> RunPlan:
    """``plan`` for a run whose LR schedule spans ``steps`` optimizer steps rather than
    ``SOLVER.MAX_ITER`` (the video project's multigrid plan): its
    :attr:`~RunPlan.run_length` is ``steps``, and its warm-up that run's
    (:func:`warmup_steps` of ``steps``) unless it ramps the batch (its schedule then follows
    ``SOLVER.MAX_ITER`` in images). ``plan`` itself when ``steps`` is its own length."""
    if steps == plan.run_length:
        return plan
    if plan.schedule.ramped or steps == plan.max_iter:
        return replace(plan, run_steps=steps)
    return replace(plan, run_steps=steps, warmup_iters=warmup_steps(cfg, steps))
