"""The learning rate: the linear scaling rule (LSR) on top of Detectron2's warmup schedule.

LargeDet's first ingredient (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): when
the global batch B grows k times over a reference batch, the peak LR grows k times
("linear") or sqrt(k) times ("sqrt", for adaptive optimizers), starting from a
reference LR known to work (``SOLVER.LSR``), and training starts with a warmup from
``WARMUP_FACTOR x LR`` over ``SOLVER.WARMUP_ITERS`` optimizer steps.

With ``SOLVER.LSR.ENABLED`` the scaled LR replaces ``SOLVER.BASE_LR``: the optimizer's
parameter groups are built with it (biases times ``SOLVER.BIAS_LR_FACTOR``, as in
Detectron2) and the schedule multiplies it. The whole schedule is one Detectron2
``LRMultiplier`` over a ``WarmupParamScheduler``, stepped once per optimizer step by
Detectron2's ``LRScheduler`` hook; nothing else writes the LR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from detectron2.config import CfgNode
from detectron2.solver import build_lr_scheduler as _d2_build_lr_scheduler

__all__ = ["LSR_RULES", "LRScaling", "build_lr_scheduler", "lr_scaling", "with_scaled_lr"]

#: SOLVER.LSR.RULE -> the factor applied to REFERENCE_LR, as a function of B / REFERENCE_BATCH.
LSR_RULES = {"linear": lambda ratio: ratio, "sqrt": math.sqrt}


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
    """The peak LR that ``cfg`` asks for: ``SOLVER.BASE_LR``, or the LSR's when enabled."""
    solver = cfg.SOLVER
    if not solver.LSR.ENABLED:
        return LRScaling(lr=float(solver.BASE_LR), rule="none", global_batch=solver.IMS_PER_BATCH)
    lsr = solver.LSR
    if lsr.RULE not in LSR_RULES:
        raise ValueError(f"SOLVER.LSR.RULE must be one of {sorted(LSR_RULES)}, got {lsr.RULE!r}")
    if lsr.REFERENCE_BATCH < 1 or lsr.REFERENCE_LR <= 0:
        raise ValueError(
            "SOLVER.LSR needs REFERENCE_BATCH >= 1 and REFERENCE_LR > 0, got "
            f"{lsr.REFERENCE_BATCH} and {lsr.REFERENCE_LR}"
        )
    factor = LSR_RULES[lsr.RULE](solver.IMS_PER_BATCH / lsr.REFERENCE_BATCH)
    return LRScaling(
        lr=lsr.REFERENCE_LR * factor,
        rule=lsr.RULE,
        global_batch=solver.IMS_PER_BATCH,
        reference_lr=float(lsr.REFERENCE_LR),
        reference_batch=lsr.REFERENCE_BATCH,
    )


def with_scaled_lr(cfg: CfgNode) -> CfgNode:
    """A copy of ``cfg`` whose ``SOLVER.BASE_LR`` is the peak LR of :func:`lr_scaling`.

    For the builders that read ``SOLVER.BASE_LR`` (``largedet.solver.build_optimizer``,
    Detectron2's LR schedules); the copy is handed to them and not kept. Returns ``cfg``
    itself when the LSR is disabled.
    """
    if not cfg.SOLVER.LSR.ENABLED:
        return cfg
    scaled = cfg.clone()
    scaled.defrost()
    scaled.SOLVER.BASE_LR = lr_scaling(cfg).lr
    scaled.freeze()
    return scaled


def build_lr_scheduler(
    cfg: CfgNode, optimizer: torch.optim.Optimizer, max_iter: int | None = None
) -> torch.optim.lr_scheduler.LRScheduler:
    """Detectron2's schedule (``SOLVER.LR_SCHEDULER_NAME``, warmup, steps) around the peak LR,
    over ``max_iter`` optimizer steps (default ``SOLVER.MAX_ITER``; the trainer gives its
    run length, :meth:`largedet.engine.Trainer.run_length`).

    The returned ``LRMultiplier`` multiplies each parameter group's initial LR (which
    the optimizer got from :func:`with_scaled_lr`) by the schedule at each step; only
    ``WarmupCosineLR`` reads the peak LR itself (``BASE_LR_END`` is relative to it).
    ``SOLVER.WARMUP_ITERS`` and ``SOLVER.STEPS`` are steps whatever the length.
    """
    cfg = with_scaled_lr(cfg)
    if max_iter is not None and max_iter != cfg.SOLVER.MAX_ITER:
        cfg = cfg.clone()  # handed to Detectron2's builder, not kept
        cfg.defrost()
        cfg.SOLVER.MAX_ITER = max_iter
        cfg.freeze()
    return _d2_build_lr_scheduler(cfg, optimizer)
