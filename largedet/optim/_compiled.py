"""The compiled step of PMD-LAMB, LAMB and LARS (``fused=True``): generated kernels, tensor
by tensor.

Each optimizer's update of one tensor is written below as plain tensor code and compiled
with ``torch.compile`` (Inductor: C++/OpenMP loops on the CPU, Triton kernels on a GPU).
PMD-LAMB and LAMB make two passes over a tensor: the first reads the weight, gradient and
moments, writes the moments and reduces the norms of the weight and of the update
direction; the second applies the direction with the trust ratio (one graph that keeps
the direction in a temporary, or, for the largest tensors on the CPU, two graphs, the
second recomputing it). LARS reduces its two norms, then makes one pass. The eager
multi-tensor step runs one pass per operation.

So that a few compilations serve every tensor and every step:

* each tensor is handed over as a 2-D alias of its memory (:func:`as_matrix`), so that
  one graph with symbolic sizes covers tensors of every shape (plus graphs for the
  sizes that torch.compile specialises: rows or columns of 1);
* every number that changes between groups or steps (the LR, the moment weights and the
  PMD decay factor in them, ``eps``, weight decay, the trust clamp, ``adapt``) is a value
  in a small tensor, not a constant of the graph: nothing is guarded on it.

The state is the eager step's, tensor for tensor (``exp_avg``, ``exp_avg_sq`` or
``momentum_buffer`` shaped like the parameter; the scalar weights stay Python floats), so
checkpoints move between the eager and the compiled step. Where compilation is not
available (no C++ compiler, an old torch, an unsupported device) the first call logs one
line and every step from then on takes the eager multi-tensor path.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "CompiledState",
    "compiled_step_available",
    "as_matrix",
    "flattenable",
    "lars_tensor",
    "pmd_lamb_apply",
    "pmd_lamb_moments",
    "pmd_lamb_tensor",
    "run_compiled",
    "update_tensors",
]

logger = logging.getLogger(__name__)

#: name -> the compiled callable, made on first use
_COMPILED: Dict[str, Callable] = {}


def _norm(t: Tensor) -> Tensor:
    """The L2 norm of a matrix from :func:`as_matrix`: row sums first, then their sum (a
    two-level reduction, which Inductor vectorises along the rows; about 1.5x faster on
    the CPU than its reduction of a flat array)."""
    return (t * t).sum(1).sum().sqrt()


def pmd_lamb_moments(w: Tensor, g: Tensor, m: Tensor, v: Tensor, s: Tensor) -> Tensor:
    """PMD-LAMB's first pass over one tensor (docs/pmd_lamb.md, "The update"): updates the
    stored ``m = m_t / a_t`` and ``v = v_t / b_t`` in place, returns ``lr * trust``.

    ``w``, ``g``: the parameter and gradient (any floating dtype), ``m``, ``v`` the state
    (state dtype), all matrices of one shape (:func:`as_matrix`). ``s`` holds, in the state
    dtype: the lerp weight ``(1 - beta1) / a_t``, the factor ``gamma * beta2 * b_{t-1} /
    b_t`` on ``v``, the factor ``(1 - beta2) / b_t`` on ``g^2``, ``lr``, ``eps``,
    ``lambda``, the trust clamp (``inf`` for none) and ``adapt`` (1 or 0). Compiled alone,
    the update direction ``x_t`` is reduced to its norm here and recomputed by
    :func:`pmd_lamb_apply`, so that no tensor the size of the parameter is allocated.
    """
    wf = w.to(m.dtype)
    gf = g.to(m.dtype)
    m_new = torch.lerp(m, gf, s[0])
    v_new = v * s[1] + gf * gf * s[2]
    x = wf * s[5] + m_new / (v_new.sqrt() + s[4])
    m.copy_(m_new)
    v.copy_(v_new)
    w_norm = _norm(wf)
    x_norm = _norm(x)
    ratio = torch.where((w_norm > 0) & (x_norm > 0), w_norm / x_norm, torch.ones_like(w_norm))
    trust = torch.where(s[7] > 0, ratio.clamp(max=s[6]), torch.ones_like(w_norm))
    return s[3] * trust


def pmd_lamb_apply(w: Tensor, m: Tensor, v: Tensor, s: Tensor, step_size: Tensor) -> None:
    """PMD-LAMB's second pass: ``w -= step_size * x_t``, ``x_t`` recomputed from the updated
    moments exactly as :func:`pmd_lamb_moments` computed it."""
    wf = w.to(m.dtype)
    x = wf * s[5] + m / (v.sqrt() + s[4])
    w.copy_(wf - step_size * x)


def lars_tensor(w: Tensor, g: Tensor, buf: Tensor, s: Tensor) -> None:
    """LARS's update of one tensor (:mod:`largedet.optim.lars`), in place: the two norms,
    then one pass that updates the momentum buffer and the weight.

    ``s`` holds, in the state dtype: ``lr``, ``momentum``, ``lambda``, ``eta`` and
    ``adapt`` (1 or 0).
    """
    wf = w.to(buf.dtype)
    gf = g.to(buf.dtype)
    w_norm = _norm(wf)
    g_norm = _norm(gf)
    ratio = torch.where(
        (w_norm > 0) & (g_norm > 0),
        s[3] * w_norm / (g_norm + s[2] * w_norm),
        torch.ones_like(w_norm),
    )
    trust = torch.where(s[4] > 0, ratio, torch.ones_like(w_norm))
    buf_new = buf * s[1] + (s[0] * trust) * (gf + wf * s[2])
    buf.copy_(buf_new)
    w.copy_(wf - buf_new)


def pmd_lamb_tensor(w: Tensor, g: Tensor, m: Tensor, v: Tensor, s: Tensor) -> None:
    """Both passes of PMD-LAMB in one graph: Inductor keeps the update direction in a
    temporary the size of the tensor between them, which costs less than a second call
    where that temporary is reused from the allocator's cache (``SINGLE_GRAPH_MAX_NUMEL``)."""
    pmd_lamb_apply(w, m, v, s, pmd_lamb_moments(w, g, m, v, s))


#: On the CPU, PMD-LAMB tensors up to this many elements take :func:`pmd_lamb_tensor` (one
#: call), larger ones :func:`pmd_lamb_moments` then :func:`pmd_lamb_apply` (two calls, no
#: temporary). ``python benchmarks/compiled_step_sizes.py`` on a 2-core Xeon, quiet,
#: 2026-11-26: one graph takes 0.64x the time of two at 65,536 elements, 0.81x at 2,359,296
#: and 0.81x at 12,845,056. The limit came from an earlier measurement beside two training
#: jobs, where one graph took 1.96x at 12,845,056 (glibc gives each call's 51 MB temporary
#: fresh pages: its mmap threshold tops out at 32 MB); on a quiet machine it does not pay.
SINGLE_GRAPH_MAX_NUMEL = 1 << 22


def _pmd_lamb(w: Tensor, g: Tensor, m: Tensor, v: Tensor, s: Tensor) -> None:
    if w.device.type != "cpu" or w.numel() <= SINGLE_GRAPH_MAX_NUMEL:
        _compiled("pmd_lamb")(w, g, m, v, s)
        return
    step_size = _compiled("pmd_lamb_moments")(w, g, m, v, s)
    _compiled("pmd_lamb_apply")(w, m, v, s, step_size)


_BODIES = {
    "pmd_lamb": pmd_lamb_tensor,
    "pmd_lamb_moments": pmd_lamb_moments,
    "pmd_lamb_apply": pmd_lamb_apply,
    "lars": lars_tensor,
}
#: update name -> the function that runs it on one tensor's matrices and numbers
_UPDATES: Dict[str, Callable] = {
    "pmd_lamb": _pmd_lamb,
    "lars": lambda *args: _compiled("lars")(*args),
}

#: the widest row of :func:`as_matrix`
MAX_COLUMNS = 1024


def as_matrix(t: Tensor) -> Tensor:
    """A 2-D tensor over ``t``'s elements in memory order, sharing its memory, not a view.

    Its rows are as wide as the largest power of two up to ``MAX_COLUMNS`` that divides
    ``t.numel()``, so that the norm's row sums vectorise. ``t`` must be dense in memory
    (:func:`flattenable`). A view (``t.view(rows, cols)``) would make ``torch.compile``
    guard on its base's shape, and so compile once per parameter shape.
    """
    n = t.numel()
    cols = 1
    while cols < MAX_COLUMNS and n % (2 * cols) == 0:
        cols *= 2
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    return out.set_(t.untyped_storage(), t.storage_offset(), (n // cols, cols), (cols, 1))


def flattenable(tensors: Sequence[Tensor]) -> bool:
    """Whether ``tensors`` (a parameter, its gradient and state) can be updated as flat
    arrays: each dense in memory, all with the same strides, element for element, and
    not empty."""
    first = tensors[0]
    if first.numel() == 0 or not _dense(first):
        return False
    return all(t.shape == first.shape and t.stride() == first.stride() for t in tensors[1:])


def _dense(t: Tensor) -> bool:
    if t.is_contiguous():
        return True
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


class CompiledState:
    """Whether one optimizer's compiled step still runs. A failed compilation turns it off for
    that optimizer only (:attr:`disabled_reason`, logged once): its later steps take the
    eager path; other optimizers of the process keep theirs."""

    def __init__(self) -> None:
        self.disabled_reason: Optional[str] = None

    def disable(self, reason: str) -> None:
        if self.disabled_reason is None:
            self.disabled_reason = reason
            logger.warning(
                "Compiled optimizer step unavailable (%s): taking the eager multi-tensor step", reason
            )


def compiled_step_available() -> bool:
    """Whether ``torch.compile`` can be used at all here (it can still fail on first use)."""
    if not hasattr(torch, "compile"):
        return False
    try:
        return bool(torch._dynamo.is_dynamo_supported())
    except Exception:
        return False


def _compiled(name: str) -> Callable:
    fn = _COMPILED.get(name)
    if fn is None:
        fn = torch.compile(_BODIES[name], fullgraph=True, dynamic=True)
        _COMPILED[name] = fn
    return fn


def run_compiled(
    name: str, tensors: List[List[Tensor]], scalars: List[List[float]], state: CompiledState
) -> Optional[int]:
    """Runs the compiled update ``name`` on each tensor in turn.

    ``tensors[i]`` is the i-th parameter's ``[w, g, state...]`` (see :func:`pmd_lamb_tensor`,
    :func:`lars_tensor`), ``scalars[i]`` its numbers. Returns None when all were updated,
    else the index of the first tensor not updated (compilation failed on it: ``state``, the
    optimizer's, takes the eager step from then on, and the caller updates the rest).
    """
    if not compiled_step_available():
        state.disable("torch.compile is not supported here")
        return 0
    update = _UPDATES[name]
    packed: Dict[tuple, Tensor] = {}  # the numbers as a tensor, made once per step
    for i, (column, numbers) in enumerate(zip(tensors, scalars)):
        key = (tuple(numbers), column[2].dtype, column[0].device)
        s = packed.get(key)
        if s is None:
            s = torch.tensor(numbers, dtype=column[2].dtype).to(column[0].device, non_blocking=True)
            packed[key] = s
        try:
            update(*(as_matrix(t) for t in column), s)
        except Exception as err:  # compilation failure: keep training on the eager step
            state.disable(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            return i
        for t in column[:1] + column[2:]:
            torch.autograd.graph.increment_version(t)
    return None


def update_tensors(
    name: str, columns: List[List[Tensor]], numbers: List[List[float]], min_numel: int,
    state: CompiledState,
) -> List[int]:
    """Runs the compiled update ``name`` on each tensor of at least ``min_numel`` elements
    whose ``columns[i]`` (``[w, g, state...]``) :func:`flattenable` accepts, with its
    ``numbers[i]``; returns, in order, the indices left to the caller's eager path: the
    others, and those after a failed compilation."""
    chosen = [i for i, c in enumerate(columns) if c[0].numel() >= min_numel and flattenable(c)]
    failed_at = run_compiled(name, [columns[i] for i in chosen], [numbers[i] for i in chosen], state)
    done = set(chosen if failed_at is None else chosen[:failed_at])
    return [i for i in range(len(columns)) if i not in done]


def trust_clamp(max_trust_ratio: Optional[float]) -> float:
    """The clamp as a number: ``inf`` for no clamp."""
    return math.inf if max_trust_ratio is None else float(max_trust_ratio)
