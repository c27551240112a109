"""LARS (You, Gitman, Ginsburg 2017): SGD with momentum and a layer-wise trust ratio.

For each parameter tensor ``w`` with gradient ``g``, at step ``t`` (Algorithm 1 of the
paper, the learning rate inside the momentum buffer)::

    d_t    = g_t + lambda * w_{t-1}                     lambda = weight decay
    trust  = eta * ||w_{t-1}|| / (||g_t|| + lambda * ||w_{t-1}||)
                                       if ||w_{t-1}|| > 0 and ||g_t|| > 0, else 1
    buf_t  = mu * buf_{t-1} + lr_t * trust * d_t        buf_0 = 0, mu = momentum
    w_t    = w_{t-1} - buf_t                            (trust = 1 where adapt=False)

With ``adapt=False`` a group is plain SGD with momentum and L2 weight decay, the
learning rate applied before the momentum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch import Tensor

from ._compiled import CompiledState, update_tensors
from ._base import (
    LOW_PRECISION_DTYPES,
    LayerwiseOptimizer,
    foreach_buckets,
    layerwise_trust,
    state_dtype,
    upcast,
)

__all__ = ["LARS"]


@dataclass
class _Inputs:
    params: List[Tensor] = field(default_factory=list)
    grads: List[Tensor] = field(default_factory=list)
    momentum_buffers: List[Tensor] = field(default_factory=list)


class LARS(LayerwiseOptimizer):
    """Layer-wise Adaptive Rate Scaling; see the module docstring for the equations.

    Args:
        params: parameters or parameter groups; every argument below can be set per group.
        lr: learning rate ``lr_t``, >= 0.
        momentum: ``mu``, >= 0.
        weight_decay: ``lambda`` (L2, added to the gradient), >= 0.
        eta: trust coefficient ``eta``, > 0.
        adapt: apply the layer-wise trust ratio; with False, ``trust = 1``.
        foreach: multi-tensor path if True or None (default), per-tensor path if False.
        fused: the compiled step (:mod:`largedet.optim._compiled`) for every tensor if
            True; with None (default), for the tensors where it was measured faster
            (:func:`largedet.optim._base.compiled_min_numel`); the eager step if False.
            ``foreach`` chooses the eager path of the other tensors.

    State per parameter: ``step`` (int) and ``momentum_buffer`` (``buf_t``, shaped like
    the parameter, float32 or better).
    """

    _class_defaults = {
        "weight_decay": 0.0,
        "eta": 0.001,
        "adapt": True,
        "foreach": None,
        "fused": None,
    }

    def __init__(
        self,
        params: Iterable,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        adapt: bool = True,
        foreach: Optional[bool] = None,
        fused: Optional[bool] = None,
    ) -> None:
        super().__init__(params, self.hyperparameters(locals()))

    def _validate_group(self, group: Dict[str, Any]) -> None:
        for name in ("lr", "momentum", "weight_decay"):
            if not group[name] >= 0.0:
                raise ValueError(f"Invalid {name}: {group[name]!r} (must be >= 0)")
        if not group["eta"] > 0.0:
            raise ValueError(f"Invalid eta: {group['eta']!r} (must be > 0)")
        self._validate_switches(group)

    def _prepare(self, group: Dict[str, Any]) -> _Inputs:
        inputs = _Inputs()
        for p in group["params"]:
            if p.grad is None:
                continue
            self._check_grad(type(self).__name__, p.grad)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                state["momentum_buffer"] = torch.zeros_like(
                    p, dtype=state_dtype(p), memory_format=torch.preserve_format
                )
            state["step"] += 1
            inputs.params.append(p)
            inputs.grads.append(p.grad)
            inputs.momentum_buffers.append(state["momentum_buffer"])
        return inputs

    def _update_paths(self) -> Dict[str, Callable[..., None]]:
        return {
            "compiled": functools.partial(_lars_compiled, state=self.compiled_state),
            "per_tensor": _lars_per_tensor,
            "multi_tensor": _lars_foreach,
        }

    def _step_args(self, group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: group[k] for k in ("lr", "momentum", "weight_decay", "eta", "adapt")}


def _lars_compiled(
    inputs: _Inputs,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    eta: float,
    adapt: bool,
    min_numel: int = 0,
    foreach: bool = True,
    state: CompiledState,
) -> None:
    """Compiled path (:func:`largedet.optim._compiled.lars_tensor`, one kernel per tensor)
    for the tensors of at least ``min_numel`` elements. The others, a tensor that is not
    dense in memory, and every tensor after a failed compilation take the eager path
    (multi-tensor where ``foreach``, else per-tensor)."""
    columns = [list(c) for c in zip(inputs.params, inputs.grads, inputs.momentum_buffers)]
    numbers = [[lr, momentum, weight_decay, eta, float(adapt)]] * len(columns)
    eager = update_tensors("lars", columns, numbers, min_numel, state)
    if eager:
        subset = _Inputs(*([getattr(inputs, f)[i] for i in eager]
                           for f in ("params", "grads", "momentum_buffers")))  # fmt: skip
        update = _lars_foreach if foreach else _lars_per_tensor
        update(subset, lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta,
               adapt=adapt)  # fmt: skip


def _lars_per_tensor(
    inputs: _Inputs, *, lr: float, momentum: float, weight_decay: float, eta: float, adapt: bool
) -> None:
    """Reference path: one parameter at a time, the same operations as the foreach path."""
    for i, p in enumerate(inputs.params):
        (w,), (g,) = upcast([p]), upcast([inputs.grads[i]])
        buf = inputs.momentum_buffers[i]
        d = g.add(w, alpha=weight_decay) if weight_decay != 0.0 else g
        buf.mul_(momentum)
        if adapt:
            trust = layerwise_trust(
                [torch.linalg.vector_norm(w)],
                [torch.linalg.vector_norm(g)],
                eta=eta,
                weight_decay=weight_decay,
            )
            buf.addcmul_(d, trust[0], value=lr)
        else:
            buf.add_(d, alpha=lr)
        w.sub_(buf)
        if w is not p:
            p.copy_(w)


def _lars_foreach(
    inputs: _Inputs, *, lr: float, momentum: float, weight_decay: float, eta: float, adapt: bool
) -> None:
    """Multi-tensor path: ``torch._foreach_*`` per bucket of one device and dtype, no host sync."""
    for dtype, idx in foreach_buckets(inputs.params):
        params = [inputs.params[i] for i in idx]
        w = upcast(params)
        g = upcast([inputs.grads[i] for i in idx])
        buf = [inputs.momentum_buffers[i] for i in idx]
        d = torch._foreach_add(g, w, alpha=weight_decay) if weight_decay != 0.0 else g
        torch._foreach_mul_(buf, momentum)
        if adapt:
            trust = layerwise_trust(
                torch._foreach_norm(w), torch._foreach_norm(g), eta=eta, weight_decay=weight_decay
            )
            torch._foreach_addcmul_(buf, d, trust.unbind(0), value=lr)
        else:
            torch._foreach_add_(buf, d, alpha=lr)
        torch._foreach_sub_(w, buf)
        if dtype in LOW_PRECISION_DTYPES:
            torch._foreach_copy_(params, w)
