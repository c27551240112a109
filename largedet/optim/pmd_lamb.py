"""PMD-LAMB (Wang et al., ECCV 2020) and LAMB (You et al., 2019) with bias correction.

PMD-LAMB is LAMB whose accumulated moments decay periodically: inside each period of
``T`` steps the moments are multiplied by a coefficient ``gamma`` that falls from 1
towards 0, then restarts, so that stale gradients stop dragging the update at very
large batch sizes. For step ``t = 1, 2, ...`` and gradient ``g_t`` (docs/pmd_lamb.md,
"The update")::

    u      = ((t - 1) mod T) / T
    gamma  = d(u)       cosine: (1 + cos(pi u)) / 2,  linear: 1 - u,  none: 1
    m_t    = gamma * beta1 * m_{t-1} + (1 - beta1) * g_t
    v_t    = gamma * beta2 * v_{t-1} + (1 - beta2) * g_t^2
    a_t    = gamma * beta1 * a_{t-1} + (1 - beta1)          a_0 = 0
    b_t    = gamma * beta2 * b_{t-1} + (1 - beta2)          b_0 = 0
    r_t    = (m_t / a_t) / (sqrt(v_t / b_t) + eps)
    x_t    = r_t + lambda * w_{t-1}
    trust  = ||w_{t-1}|| / ||x_t|| if both norms > 0 else 1, then min(trust, max_trust_ratio)
    w_t    = w_{t-1} - lr * trust * x_t                     (trust = 1 where adapt=False)

Norms are per parameter tensor. With ``decay="none"`` this is LAMB with bias
correction (``a_t = 1 - beta1^t``, ``b_t = 1 - beta2^t``).

The optimizer's clock (:meth:`PMDLAMB.set_clock`, default None) replaces ``t - 1`` in ``u``
when set: a float, the step's position in steps of a reference batch, so that a run whose
batch changes (a batch ramp) keeps its period ``T`` in images (``u = (clock mod T) / T``).
The trainer sets it before each step; ``t`` still counts steps for ``a_t``, ``b_t``.

Implementation note: the optimizer stores the normalised moments
``exp_avg = m_t / a_t`` and ``exp_avg_sq = v_t / b_t`` (weighted averages of past
gradients) together with the scalars ``a_t``, ``b_t``. Dividing the recursions by
``a_t`` and ``b_t`` gives, exactly in real arithmetic::

    m_t / a_t = lerp(m_{t-1} / a_{t-1}, g_t, (1 - beta1) / a_t)
    v_t / b_t = (gamma * beta2 * b_{t-1} / b_t) * v_{t-1} / b_{t-1} + ((1 - beta2) / b_t) * g_t^2

which needs fewer passes over memory than updating ``m_t`` and dividing it again.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from ._compiled import CompiledState, trust_clamp, update_tensors
from ._base import (
    LOW_PRECISION_DTYPES,
    LayerwiseOptimizer,
    Scratch,
    cpu_pieces,
    foreach_buckets,
    layerwise_trust,
    state_dtype,
    upcast,
)

__all__ = ["PMDLAMB", "LAMB", "MOMENT_DECAYS", "moment_decay"]

#: decay shape name -> d(u) for the position u in [0, 1) inside the period
MOMENT_DECAYS: Dict[str, Callable[[float], float]] = {
    "cosine": lambda u: (1.0 + math.cos(math.pi * u)) / 2.0,
    "linear": lambda u: 1.0 - u,
    "none": lambda u: 1.0,
}


def moment_decay(step: int, period: int, decay: str) -> float:
    """gamma for step ``t = step`` (1-based): ``d(((t - 1) mod T) / T)`` with ``T = period``."""
    return MOMENT_DECAYS[decay](((step - 1) % period) / period)


@dataclass
class _Inputs:
    """The tensors of one parameter group that have gradients, and their per-step scalars."""

    params: List[Tensor] = field(default_factory=list)
    grads: List[Tensor] = field(default_factory=list)
    exp_avgs: List[Tensor] = field(default_factory=list)
    exp_avg_sqs: List[Tensor] = field(default_factory=list)
    # lerp weight of g_t into m/a: (1 - beta1) / a_t
    avg_weights: List[float] = field(default_factory=list)
    # factor on v_{t-1}/b_{t-1}: gamma * beta2 * b_{t-1} / b_t
    sq_keeps: List[float] = field(default_factory=list)
    # factor on g_t^2: (1 - beta2) / b_t
    sq_weights: List[float] = field(default_factory=list)


class PMDLAMB(LayerwiseOptimizer):
    """LAMB with periodic moment decay (PMD-LAMB); see the module docstring for the equations.

    Args:
        params: parameters or parameter groups. ``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``period``, ``decay``, ``max_trust_ratio``, ``adapt`` and
            ``foreach`` can be set per group.
        lr: learning rate (``lr``), >= 0.
        betas: ``(beta1, beta2)``, each in [0, 1).
        eps: ``eps`` added to ``sqrt(v_t / b_t)``, > 0.
        weight_decay: ``lambda``, decoupled into ``x_t`` before the trust ratio, >= 0.
        period: ``T``, steps per decay period, an integer >= 1.
        decay: shape ``d`` of the decay inside a period: "cosine", "linear" or "none".
        max_trust_ratio: upper clamp of the trust ratio (> 0), or None for no clamp.
        adapt: apply the layer-wise trust ratio; with False, ``trust = 1``.
        foreach: multi-tensor (``torch._foreach_*``) path if True or None (default),
            per-tensor path if False. Both give the same numbers.
        fused: the compiled step (:mod:`largedet.optim._compiled`: generated kernels,
            tensor by tensor, equal to the eager step within float32 rounding) for every
            tensor if True; with None (default), for the tensors where it was measured
            faster (:func:`largedet.optim._base.compiled_min_numel`); the eager step if
            False. ``foreach`` chooses the eager path of the other tensors.

    State per parameter: ``step`` (int ``t``, so that the period phase survives a
    checkpoint), ``exp_avg`` (``m_t / a_t``) and ``exp_avg_sq`` (``v_t / b_t``), shaped
    like the parameter, in float32 or better, and the floats ``exp_avg_weight``
    (``a_t``) and ``exp_avg_sq_weight`` (``b_t``). A parameter whose ``grad`` is None
    is skipped and its ``t`` does not advance.
    """

    #: the training loop sets the period's clock under a batch ramp (:meth:`set_clock`)
    uses_clock = True

    _class_defaults = {
        "weight_decay": 0.0,
        "period": 200,
        "decay": "cosine",
        "max_trust_ratio": 10.0,
        "adapt": True,
        "foreach": None,
        "fused": None,
    }

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        period: int = 200,
        decay: str = "cosine",
        max_trust_ratio: Optional[float] = 10.0,
        adapt: bool = True,
        foreach: Optional[bool] = None,
        fused: Optional[bool] = None,
    ) -> None:
        super().__init__(params, self.hyperparameters(locals()))
        self.clock: Optional[float] = None

    def set_clock(self, clock: Optional[float]) -> None:
        """Put the next step at ``clock`` on the period's clock (the position ``t - 1`` of
        ``u = ((t - 1) mod T) / T``, in steps of the full batch): a trainer whose global
        batch changes (a batch ramp) sets it before each step, so that a period is a fixed
        number of images. None: each parameter's own step count."""
        self.clock = clock

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("clock", None)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # a group entry in checkpoints of earlier versions
            group.pop("clock", None)

    def _validate_group(self, group: Dict[str, Any]) -> None:
        lr, betas, eps = group["lr"], group["betas"], group["eps"]
        if not lr >= 0.0:
            raise ValueError(f"Invalid lr: {lr!r} (must be >= 0)")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Invalid betas: {betas!r} (two values, each in [0, 1))")
        if not eps > 0.0:
            raise ValueError(f"Invalid eps: {eps!r} (must be > 0)")
        if not group["weight_decay"] >= 0.0:
            raise ValueError(f"Invalid weight_decay: {group['weight_decay']!r} (must be >= 0)")
        period = group["period"]
        if isinstance(period, bool) or not isinstance(period, numbers.Integral) or period < 1:
            raise ValueError(f"Invalid period: {period!r} (must be an integer >= 1)")
        if group["decay"] not in MOMENT_DECAYS:
            raise ValueError(f"Invalid decay: {group['decay']!r} (one of {sorted(MOMENT_DECAYS)})")
        mtr = group["max_trust_ratio"]
        if mtr is not None and not mtr > 0.0:
            raise ValueError(f"Invalid max_trust_ratio: {mtr!r} (must be > 0 or None)")
        self._validate_switches(group)

    def _prepare(self, group: Dict[str, Any]) -> _Inputs:
        """Collects the group's tensors, creates missing state, advances t, a_t, b_t."""
        beta1, beta2 = group["betas"]
        period, decay, clock = group["period"], MOMENT_DECAYS[group["decay"]], self.clock
        inputs = _Inputs()
        for p in group["params"]:
            if p.grad is None:
                continue
            self._check_grad(type(self).__name__, p.grad)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(
                    p, dtype=state_dtype(p), memory_format=torch.preserve_format
                )
                state["exp_avg_sq"] = torch.zeros_like(
                    p, dtype=state_dtype(p), memory_format=torch.preserve_format
                )
                state["exp_avg_weight"] = 0.0
                state["exp_avg_sq_weight"] = 0.0
            t = state["step"] + 1
            position = t - 1 if clock is None else clock
            gamma = decay((position % period) / period)
            a_prev, b_prev = state["exp_avg_weight"], state["exp_avg_sq_weight"]
            a = gamma * beta1 * a_prev + (1.0 - beta1)
            b = gamma * beta2 * b_prev + (1.0 - beta2)
            state["step"], state["exp_avg_weight"], state["exp_avg_sq_weight"] = t, a, b

            inputs.params.append(p)
            inputs.grads.append(p.grad)
            inputs.exp_avgs.append(state["exp_avg"])
            inputs.exp_avg_sqs.append(state["exp_avg_sq"])
            inputs.avg_weights.append((1.0 - beta1) / a)
            inputs.sq_keeps.append(gamma * beta2 * b_prev / b)
            inputs.sq_weights.append((1.0 - beta2) / b)
        return inputs

    def _update_paths(self) -> Dict[str, Callable[..., None]]:
        return {
            "compiled": functools.partial(_pmd_lamb_compiled, state=self.compiled_state),
            "per_tensor": _pmd_lamb_per_tensor,
            "multi_tensor": functools.partial(_pmd_lamb_foreach, scratch=self.scratch),
        }

    def _step_args(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: group[k] for k in ("lr", "eps", "weight_decay", "adapt", "max_trust_ratio")}


class LAMB(PMDLAMB):
    """LAMB (You et al., 2019) with bias correction: :class:`PMDLAMB` with ``decay="none"``.

    ``m_t = beta1 m_{t-1} + (1 - beta1) g_t``, ``v_t = beta2 v_{t-1} + (1 - beta2) g_t^2``,
    ``r_t = (m_t / (1 - beta1^t)) / (sqrt(v_t / (1 - beta2^t)) + eps)``, then the same
    weight decay, trust ratio and update as PMD-LAMB. Arguments as :class:`PMDLAMB`.
    """

    _class_defaults = {**PMDLAMB._class_defaults, "period": 1, "decay": "none"}

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        max_trust_ratio: Optional[float] = 10.0,
        adapt: bool = True,
        foreach: Optional[bool] = None,
        fused: Optional[bool] = None,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            period=1,
            decay="none",
            max_trust_ratio=max_trust_ratio,
            adapt=adapt,
            foreach=foreach,
            fused=fused,
        )


def _subset(inputs: _Inputs, indices: List[int]) -> _Inputs:
    return _Inputs(
        *([getattr(inputs, f.name)[i] for i in indices] for f in dataclasses.fields(_Inputs))
    )


def _pmd_lamb_compiled(
    inputs: _Inputs,
    *,
    lr: float,
    eps: float,
    weight_decay: float,
    adapt: bool,
    max_trust_ratio: Optional[float],
    min_numel: int = 0,
    foreach: bool = True,
    state: CompiledState,
) -> None:
    """Compiled path (:func:`largedet.optim._compiled.pmd_lamb_moments` and
    :func:`~largedet.optim._compiled.pmd_lamb_apply`, tensor by tensor) for the tensors of
    at least ``min_numel`` elements. The others, a tensor that is not dense in memory, and
    every tensor after a failed compilation take the eager path (multi-tensor where
    ``foreach``, else per-tensor)."""
    clamp = trust_clamp(max_trust_ratio)
    tensors = (inputs.params, inputs.grads, inputs.exp_avgs, inputs.exp_avg_sqs)
    columns = [list(column) for column in zip(*tensors)]
    weights = zip(inputs.avg_weights, inputs.sq_keeps, inputs.sq_weights)
    numbers = [[*w, lr, eps, weight_decay, clamp, float(adapt)] for w in weights]
    eager = update_tensors("pmd_lamb", columns, numbers, min_numel, state)
    if eager:
        update = _pmd_lamb_foreach if foreach else _pmd_lamb_per_tensor
        update(_subset(inputs, eager), lr=lr, eps=eps, weight_decay=weight_decay, adapt=adapt,
               max_trust_ratio=max_trust_ratio)  # fmt: skip


def _pmd_lamb_per_tensor(
    inputs: _Inputs,
    *,
    lr: float,
    eps: float,
    weight_decay: float,
    adapt: bool,
    max_trust_ratio: Optional[float],
) -> None:
    """Reference path: one parameter at a time, the same operations as the foreach path."""
    for i, p in enumerate(inputs.params):
        (w,), (g,) = upcast([p]), upcast([inputs.grads[i]])
        m, v = inputs.exp_avgs[i], inputs.exp_avg_sqs[i]
        m.lerp_(g, inputs.avg_weights[i])
        v.mul_(inputs.sq_keeps[i]).addcmul_(g, g, value=inputs.sq_weights[i])
        denom = v.sqrt().add_(eps)
        if weight_decay != 0.0:
            x = w.mul(weight_decay).addcdiv_(m, denom)
        else:
            x = m.div(denom)
        if adapt:
            trust = layerwise_trust(
                [torch.linalg.vector_norm(w)],
                [torch.linalg.vector_norm(x)],
                max_value=max_trust_ratio,
            )
            w.addcmul_(x, trust[0], value=-lr)
        else:
            w.add_(x, alpha=-lr)
        if w is not p:
            p.copy_(w)


def _pmd_lamb_foreach(
    inputs: _Inputs,
    *,
    lr: float,
    eps: float,
    weight_decay: float,
    adapt: bool,
    max_trust_ratio: Optional[float],
    scratch: Optional[Scratch] = None,
) -> None:
    """Multi-tensor path: ``torch._foreach_*`` per bucket of one device and dtype, no host
    sync. On the CPU, with ``scratch``, the element-wise part runs on cache-sized pieces
    into reusable buffers (:func:`_direction_in_pieces`); the numbers are the same."""
    for dtype, idx in foreach_buckets(inputs.params):
        params = [inputs.params[i] for i in idx]
        w = upcast(params)
        g = upcast([inputs.grads[i] for i in idx])
        m = [inputs.exp_avgs[i] for i in idx]
        v = [inputs.exp_avg_sqs[i] for i in idx]
        avg_weights = [inputs.avg_weights[i] for i in idx]
        sq_keeps = [inputs.sq_keeps[i] for i in idx]
        sq_weights = [inputs.sq_weights[i] for i in idx]
        if (
            scratch is not None
            and w[0].device.type == "cpu"
            and all(t.is_contiguous() for t in itertools.chain(w, g, m, v))
        ):
            x = _direction_in_pieces(
                w, g, m, v, avg_weights, sq_keeps, sq_weights, eps, weight_decay, scratch
            )
        else:
            torch._foreach_lerp_(m, g, avg_weights)
            torch._foreach_mul_(v, sq_keeps)
            torch._foreach_addcmul_(v, g, g, sq_weights)
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, eps)
            if weight_decay != 0.0:
                x = torch._foreach_mul(w, weight_decay)
                torch._foreach_addcdiv_(x, m, denom)
            else:
                x = torch._foreach_div(m, denom)
            del denom
        if adapt:
            trust = layerwise_trust(
                torch._foreach_norm(w), torch._foreach_norm(x), max_value=max_trust_ratio
            )
            torch._foreach_addcmul_(w, x, trust.unbind(0), value=-lr)
        else:
            torch._foreach_add_(w, x, alpha=-lr)
        if dtype in LOW_PRECISION_DTYPES:
            torch._foreach_copy_(params, w)


def _direction_in_pieces(
    w: List[Tensor],
    g: List[Tensor],
    m: List[Tensor],
    v: List[Tensor],
    avg_weights: List[float],
    sq_keeps: List[float],
    sq_weights: List[float],
    eps: float,
    weight_decay: float,
    scratch: Scratch,
) -> List[Tensor]:
    """Updates ``m`` and ``v`` and returns ``x_t`` (views of a scratch buffer), computed with
    the multi-tensor path's ops in the same order, one cache-sized group of flat pieces
    at a time (:func:`largedet.optim._base.cpu_pieces`): ``sqrt(v) + eps`` goes into a
    piece-sized scratch buffer, ``x_t`` into a bucket-sized one. No tensor is allocated."""
    x = scratch.like("x", w)
    for idx, (pw, pg, pm, pv, px) in cpu_pieces([w, g, m, v, x]):
        torch._foreach_lerp_(pm, pg, [avg_weights[i] for i in idx])
        torch._foreach_mul_(pv, [sq_keeps[i] for i in idx])
        torch._foreach_addcmul_(pv, pg, pg, [sq_weights[i] for i in idx])
        denom = scratch.like("denom", pv)
        torch._foreach_copy_(denom, pv)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, eps)
        if weight_decay != 0.0:
            torch._foreach_copy_(px, pw)
            torch._foreach_mul_(px, weight_decay)
            torch._foreach_addcdiv_(px, pm, denom)
        else:
            torch._foreach_copy_(px, pm)
            torch._foreach_div_(px, denom)
    return x
