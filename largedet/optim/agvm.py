"""AGVM: adaptive gradient variance modulation (Xue et al., NeurIPS 2022, "Large-batch
Optimization for Dense Visual Predictions").

At very large batch the parts of a dense-prediction model (backbone, FPN, RPN head, RoI
heads) see very different gradient variance, so one learning rate cannot suit them all.
AGVM measures each part's gradient variance from two independent estimates ``g_A``,
``g_B`` of the same step's gradient and rescales the part's LR towards the reference
part (the backbone). For part ``i``, with all of its tensors flattened into one vector::

    phi_i  = 1 - cos(g_A_i, g_B_i)                                 in [0, 2]
    mu_hat = sqrt(clamp(phi_ref / phi_i, lo, hi))
    mu_i   = m * mu_i + (1 - m) * mu_hat          mu_i = 1 at start; mu_ref = 1 always
    lr_i   = mu_i * lr                            lr: the scheduler's LR of the group

Why ``1 - cos`` measures variance: with ``g_A = g + n_A``, ``g_B = g + n_B`` and
independent noise of variance ``sigma^2`` in each of ``d`` coordinates,
``cos(g_A, g_B) ~ |g|^2 / (|g|^2 + d sigma^2)``, so ``phi ~ d sigma^2 / (|g|^2 + d
sigma^2)``: the noise share of the gradient, free of the gradient's scale. A part noisier
than the backbone (larger ``phi``) gets ``mu < 1``, a cleaner one ``mu > 1``.

For adaptive optimizers the comparison is on the preconditioned update: ``g_A`` and
``g_B`` are first divided elementwise by the optimizer's ``sqrt(v_hat) + eps``, with
``v_hat`` the bias-corrected second moment as the optimizer state holds it before the
step (see :data:`PRECONDITIONERS`: Adam, AdamW, LAMB and PMD-LAMB; SGD and LARS use the
raw gradient). The layer-wise trust ratio of LAMB and LARS is left out: it rescales a
whole tensor's update and does not depend on which half of the batch a sample was in.

:class:`AGVM` owns only the multipliers ``mu``; it never writes a learning rate that
outlives the optimizer step. The LR scheduler sets ``group["lr"]``, and
:meth:`AGVM.modulated_lr` multiplies it by the group's ``mu`` around ``optimizer.step()``
and puts the scheduler's value back afterwards. Every parameter group names its part
under the key :data:`PART_KEY` (``largedet.solver.get_optimizer_params`` writes it).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.optim import Optimizer

from .pmd_lamb import PMDLAMB

__all__ = [
    "AGVM",
    "Estimate",
    "PART_KEY",
    "PRECONDITIONERS",
    "PartStatistics",
    "complete_estimates",
    "gradient_variance",
    "micro_batch_halves",
    "modulation",
    "precondition",
    "rank_halves",
]

#: The parameter-group key holding the name of the model part the group belongs to.
PART_KEY = "agvm_part"


def _adam_denominator(group: dict, state: dict) -> Optional[Tensor]:
    v = state.get("max_exp_avg_sq") if group.get("amsgrad") else state.get("exp_avg_sq")
    if v is None or "step" not in state:
        return None
    step = float(state["step"])
    if step <= 0:
        return None
    correction = 1.0 - group["betas"][1] ** step
    return (v / correction).sqrt_().add_(group["eps"])


def _pmd_lamb_denominator(group: dict, state: dict) -> Optional[Tensor]:
    v = state.get("exp_avg_sq")  # stored already normalised: v_t / b_t
    if v is None or not state.get("step"):
        return None
    return v.sqrt().add_(group["eps"])


#: Optimizer class -> ``fn(group, state) -> sqrt(v_hat) + eps`` shaped like the parameter,
#: or None while the state is empty (first step: no preconditioning yet). Looked up along
#: the optimizer's MRO, so subclasses (LAMB, Detectron2's gradient-clipping wrappers) are
#: covered; classes without an entry compare raw gradients. Add an entry for another
#: adaptive optimizer.
PRECONDITIONERS: Dict[type, Callable[[dict, dict], Optional[Tensor]]] = {
    torch.optim.Adam: _adam_denominator,
    torch.optim.AdamW: _adam_denominator,
    PMDLAMB: _pmd_lamb_denominator,
}


def _preconditioner_of(optimizer: Optimizer) -> Optional[Callable[[dict, dict], Optional[Tensor]]]:
    for cls in type(optimizer).__mro__:
        if cls in PRECONDITIONERS:
            return PRECONDITIONERS[cls]
    return None


def precondition(optimizer: Optimizer, group: dict, param: Tensor, g: Tensor) -> Tensor:
    """``g / (sqrt(v_hat) + eps)`` for ``param`` of ``optimizer`` (``g`` itself where the
    optimizer is not adaptive or has no state for ``param`` yet)."""
    fn = _preconditioner_of(optimizer)
    if fn is None:
        return g
    denominator = fn(group, optimizer.state.get(param, {}))
    return g if denominator is None else g / denominator


@dataclass
class PartStatistics:
    """Sums over a part's tensors: ``<g_A, g_B>``, ``|g_A|^2`` and ``|g_B|^2``."""

    dot: float = 0.0
    norm_a: float = 0.0  # squared
    norm_b: float = 0.0  # squared


def gradient_variance(stats: PartStatistics) -> float:
    """``phi = 1 - cos(g_A, g_B)``, clipped to [0, 2] against rounding; NaN when either
    estimate is zero (no direction to compare)."""
    if not (stats.norm_a > 0 and stats.norm_b > 0):
        return math.nan
    cos = stats.dot / math.sqrt(stats.norm_a * stats.norm_b)
    return min(max(1.0 - cos, 0.0), 2.0)


def modulation(phi_reference: float, phi: float, clamp: Tuple[float, float]) -> float:
    """``mu_hat = sqrt(clamp(phi_reference / phi, lo, hi))``.

    ``phi == 0`` (the two estimates agree exactly) gives the ratio +inf, hence ``sqrt(hi)``;
    NaN when the ratio is undefined (either phi NaN, or both zero)."""
    lo, hi = clamp
    if math.isnan(phi) or math.isnan(phi_reference) or (phi == 0 and phi_reference == 0):
        return math.nan
    ratio = math.inf if phi == 0 else phi_reference / phi
    return math.sqrt(min(max(ratio, lo), hi))


class AGVM:
    """Per-part LR multipliers ``mu`` from the gradient variance of each part of a model.

    Args:
        optimizer: its parameter groups each carry :data:`PART_KEY` (a part name); a part
            may own several groups (weight decay / trust-ratio splits).
        reference: the part every other part is aligned with (``mu`` fixed at 1).
        period: estimate every ``period`` optimizer steps (an integer >= 1).
        start_iter: first iteration (0-based optimizer step) that estimates; ``mu`` is 1
            before it (usually the end of the LR warmup).
        clamp: ``(lo, hi)`` with ``0 < lo <= 1 <= hi``, bounds of ``phi_ref / phi``.
        momentum: ``m`` of the moving average of ``mu``, in [0, 1).

    Use per optimizer step: when :meth:`estimates_at` (iteration) is true, hand the two
    estimates to :meth:`update`; then ``with agvm.modulated_lr(): optimizer.step()``. The
    gradient clipping of AGVM's recipe around the end of warm-up (``SOLVER.AGVM.CLIP_*``) is
    the run plan's, applied by the training loop with any other clip
    (:func:`largedet.solver.plan.clip_rules`).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        reference: str = "backbone",
        period: int = 10,
        start_iter: int = 0,
        clamp: Tuple[float, float] = (0.5, 10.0),
        momentum: float = 0.97,
    ):
        if period < 1 or start_iter < 0:
            raise ValueError(
                f"AGVM needs period >= 1 and start_iter >= 0, got {period}, {start_iter}"
            )
        lo, hi = clamp
        if not 0 < lo <= 1 <= hi:
            raise ValueError(f"AGVM clamp must satisfy 0 < lo <= 1 <= hi, got {tuple(clamp)}")
        if not 0 <= momentum < 1:
            raise ValueError(f"AGVM momentum must be in [0, 1), got {momentum}")
        unnamed = [i for i, g in enumerate(optimizer.param_groups) if PART_KEY not in g]
        if unnamed:
            raise ValueError(
                f"AGVM needs every parameter group to name its model part under {PART_KEY!r}; "
                f"groups {unnamed} do not (build the groups with "
                "largedet.solver.get_optimizer_params and SOLVER.AGVM.ENABLED True)"
            )
        self.optimizer = optimizer
        self.parts: List[str] = list(dict.fromkeys(g[PART_KEY] for g in optimizer.param_groups))
        if reference not in self.parts:
            raise ValueError(f"AGVM reference part {reference!r} is not one of {self.parts}")
        self.reference = reference
        self.period = period
        self.start_iter = start_iter
        self.clamp = (float(lo), float(hi))
        self.momentum = momentum
        self.mu: Dict[str, float] = {name: 1.0 for name in self.parts}
        self.phi: Dict[str, float] = {}  # the last estimate
        self.num_estimates = 0
        self._group_of = {p: g for g in optimizer.param_groups for p in g["params"]}

    @property
    def params(self) -> List[Tensor]:
        """All parameters of the optimizer, in group order."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def estimates_at(self, iteration: int) -> bool:
        """Whether the step at ``iteration`` measures the variance."""
        return iteration >= self.start_iter and (iteration - self.start_iter) % self.period == 0

    @torch.no_grad()
    def statistics(
        self, estimates: Sequence[Tuple[Tensor, Optional[Tensor], Optional[Tensor]]]
    ) -> Dict[str, PartStatistics]:
        """Per part, the dot product and squared norms of the two (preconditioned)
        estimates. ``estimates``: ``(param, g_A, g_B)`` triples; a None estimate is zero.
        Sums are accumulated in float64, with one host synchronisation in all."""
        sums: Dict[str, List[Tensor]] = {}
        for param, g_a, g_b in estimates:
            if g_a is None and g_b is None:
                continue
            g_a = torch.zeros_like(g_b) if g_a is None else g_a
            g_b = torch.zeros_like(g_a) if g_b is None else g_b
            group = self._group_of[param]
            dtype = torch.promote_types(g_a.dtype, torch.float32)
            a = precondition(self.optimizer, group, param, g_a.to(dtype))
            b = precondition(self.optimizer, group, param, g_b.to(dtype))
            terms = torch.stack(
                [
                    torch.sum(a * b, dtype=torch.float64),
                    torch.sum(a * a, dtype=torch.float64),
                    torch.sum(b * b, dtype=torch.float64),
                ]
            )
            part = group[PART_KEY]
            sums.setdefault(part, []).append(terms)
        names = list(sums)
        if not names:
            return {}
        totals = torch.stack([torch.stack(sums[n]).sum(0).cpu() for n in names]).tolist()
        return {n: PartStatistics(*t) for n, t in zip(names, totals)}

    def update(
        self, estimates: Sequence[Tuple[Tensor, Optional[Tensor], Optional[Tensor]]]
    ) -> Dict[str, float]:
        """Measure ``phi`` per part from the two estimates and move each ``mu`` towards its
        ``mu_hat``; returns ``phi`` per part (also kept in :attr:`phi`). A part whose
        ``mu_hat`` is undefined (zero or non-finite gradients) keeps its ``mu``; when the
        reference's ``phi`` is undefined no ``mu`` moves."""
        stats = self.statistics(estimates)
        self.phi = {n: gradient_variance(s) for n, s in stats.items()}
        self.set_phi(self.phi)
        return self.phi

    def set_phi(self, phi: Mapping[str, float]) -> None:
        """Move each ``mu`` with the measured ``phi`` (part -> value): the EMA step."""
        self.phi = dict(phi)
        phi_ref = self.phi.get(self.reference, math.nan)
        for name in self.parts:
            if name == self.reference:
                continue
            mu_hat = modulation(phi_ref, self.phi.get(name, math.nan), self.clamp)
            if math.isfinite(mu_hat):
                self.mu[name] = self.momentum * self.mu[name] + (1.0 - self.momentum) * mu_hat
        self.num_estimates += 1

    @contextlib.contextmanager
    def modulated_lr(self) -> Iterator[None]:
        """Within the block each group's ``lr`` is the scheduler's times its part's ``mu``;
        the scheduler's values are restored on exit."""
        groups = self.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        try:
            for g, lr in zip(groups, saved):
                g["lr"] = lr * self.mu[g[PART_KEY]]
            yield
        finally:
            for g, lr in zip(groups, saved):
                g["lr"] = lr

    def state_dict(self) -> Dict:
        return {"mu": dict(self.mu), "phi": dict(self.phi), "num_estimates": self.num_estimates}

    def load_state_dict(self, state: Mapping) -> None:
        unknown = set(state["mu"]) - set(self.parts)
        if unknown:
            raise ValueError(
                f"AGVM checkpoint has parts {sorted(unknown)} that this run does not: {self.parts}"
            )
        self.mu.update(state["mu"])
        self.phi = dict(state.get("phi", {}))
        self.num_estimates = state.get("num_estimates", 0)


# --- the two estimates of a step's gradient -------------------------------------------------

#: (param, g_A, g_B) of one tensor; None where an estimate is missing or not formed yet
Estimate = Tuple[Tensor, Optional[Tensor], Optional[Tensor]]


def micro_batch_halves(
    params: Sequence[Tensor], first_half: Sequence[Optional[Tensor]], world_size: int
) -> List[Estimate]:
    """With K >= 2 micro-batches: ``(param, g_A, None)`` with ``g_A`` the gradient of the first
    ``K // 2`` micro-batches (``first_half``, copied after them), averaged over the
    ``world_size`` ranks in place (one all-reduce per dtype and device); ``g_B``, the full
    gradient minus ``g_A``, is formed by :func:`complete_estimates` after unscaling."""
    if world_size > 1:
        present = [g for g in first_half if g is not None]
        for flat, tensors in _flat_buckets(present):
            dist.all_reduce(flat)
            flat /= world_size
            for t, reduced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                t.copy_(reduced)
    return [(p, g, None) for p, g in zip(params, first_half)]


def rank_halves(params: Sequence[Tensor], rank: int, world_size: int) -> List[Estimate]:
    """With K = 1 (the step's backward pass in DDP's ``no_sync``): the local gradients
    averaged over all ranks into ``p.grad``, as DDP would, and ``(param, g_A, g_B)`` with
    ``g_A`` the mean over the first ``world_size // 2`` ranks and ``g_B`` over the others (one
    all-reduce per dtype and device for both)."""
    n_a = world_size // 2
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    sums_a = [g * (1.0 if rank < n_a else 0.0) for g in grads]
    estimates = []
    for flat, tensors in _flat_buckets(sums_a + grads):
        dist.all_reduce(flat)
        reduced = _unflatten_dense_tensors(flat, tensors)
        for t, r in zip(tensors, reduced):
            t.copy_(r)
    for p, sum_a, total in zip(params, sums_a, grads):
        g_a = sum_a / n_a
        g_b = (total - sum_a) / (world_size - n_a)
        total.div_(world_size)
        estimates.append((p, g_a, g_b))
    return estimates


def complete_estimates(estimates: Sequence[Estimate], scale: float = 1.0) -> List[Estimate]:
    """``estimates`` ready for :meth:`AGVM.update`: the gradient scaler's ``scale`` removed
    from ``g_A`` and ``g_B``, and for the micro-batch halves ``g_B = p.grad - g_A`` (``p.grad``
    is already unscaled)."""
    halves = []
    for p, g_a, g_b in estimates:
        if scale != 1.0:
            g_a = None if g_a is None else g_a / scale
            g_b = None if g_b is None else g_b / scale
        if g_b is None and p.grad is not None:
            g_b = p.grad if g_a is None else p.grad - g_a
        halves.append((p, g_a, g_b))
    return halves


def _flat_buckets(tensors: Sequence[Tensor]):
    """(flat buffer, tensors) per dtype and device, for one all-reduce each."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return [(_flatten_dense_tensors(ts), ts) for ts in groups.values()]
