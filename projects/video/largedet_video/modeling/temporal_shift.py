"""The temporal shift of TSM (Lin, Gan, Han, "TSM: Temporal Shift Module for
Efficient Video Understanding", ICCV 2019).

Frames of a clip are stacked on the batch axis, ``(N*T, C, H, W)``. The shift
moves a quarter of the channels one step along time, half of it each way, and
leaves the rest in place; with ``fold = C // fold_div`` and frame index ``t``::

    out[n, t, c]          = x[n, t + 1, c]   for c in [0, fold)         (0 at t = T - 1)
    out[n, t, fold + c]   = x[n, t - 1, fold + c]   for c in [0, fold)  (0 at t = 0)
    out[n, t, c]          = x[n, t, c]       for c in [2 * fold, C)

It has no parameters and no multiply-adds: only memory movement. The forward
writes each output element once into one fresh tensor (no concatenation of
pieces, no zero-filled temporary); the backward is the same shift with the two
directions swapped, again one allocation.

The same function has several implementations, in :data:`SHIFT_IMPLS`; all give
bit-identical values and gradients, and differ only in the kernels they launch:

- ``"slices"``: five slice copies and fills per direction, in eager PyTorch; runs
  everywhere.
- ``"triton"`` (the config's default, the fastest on an H100): one Triton kernel per
  direction (:mod:`.temporal_shift_triton`), on CUDA tensors (and on the CPU under
  ``TRITON_INTERPRET=1``); elsewhere, or without Triton, it runs ``"slices"``.
- ``"compiled"``: one ``torch.where`` expression per direction compiled by
  ``torch.compile`` (Inductor fuses it into one kernel); where ``torch.compile``
  cannot run, or under an enclosing compile, the expression runs eagerly.

``"triton"`` and ``"compiled"`` are differentiable once through their kernels; a
second derivative (``create_graph``) runs the same function again, so it is exact too.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Dict

import torch
import torch.nn.functional as F

try:
    from .temporal_shift_triton import MAX_NUMEL, triton_shift
except ImportError:  # Triton is optional: without it "triton" runs the slice form
    triton_shift = None

__all__ = ["temporal_shift", "TemporalShift", "SHIFT_IMPLS"]

#: ``kernel(x, num_segments, fold, reverse) -> shifted copy of x``: ``x`` is
#: ``(N*T, C, H, W)``, contiguous in its memory format; ``reverse`` swaps the directions.
ShiftKernel = Callable[[torch.Tensor, int, int, bool], torch.Tensor]


def _shift_into(out: torch.Tensor, x: torch.Tensor, fold: int, backward: bool) -> torch.Tensor:
    """Write the shift of ``x`` (N, T, C, H, W) into ``out`` (same shape).

    ``backward=False`` is the forward definition above. ``backward=True`` moves
    the first ``fold`` channels the other way (t takes t - 1) and the second
    ``fold`` channels the other way (t takes t + 1): the adjoint of the forward,
    which is the gradient.
    """
    a, b = slice(0, fold), slice(fold, 2 * fold)
    if backward:
        a, b = b, a
    # Channels a: frame t takes frame t + 1; the last frame has no successor.
    out[:, :-1, a] = x[:, 1:, a]
    out[:, -1:, a] = 0
    # Channels b: frame t takes frame t - 1; the first frame has no predecessor.
    out[:, 1:, b] = x[:, :-1, b]
    out[:, :1, b] = 0
    out[:, :, 2 * fold :] = x[:, :, 2 * fold :]
    return out


def _slices(x: torch.Tensor, num_segments: int, fold: int, reverse: bool) -> torch.Tensor:
    """The ``"slices"`` kernel: :func:`_shift_into` a fresh tensor."""
    nt, c, h, w = x.shape
    out = torch.empty_like(x)
    clips = (nt // num_segments, num_segments, c, h, w)
    _shift_into(out.view(clips), x.view(clips), fold, backward=reverse)
    return out


def _where(x: torch.Tensor, num_segments: int, fold: int, reverse: bool) -> torch.Tensor:
    """The shift as one expression over a time-padded view: the form ``torch.compile``
    fuses into a single kernel (eagerly it is slower than :func:`_slices`)."""
    nt, c, h, w = x.shape
    clips = x.view(nt // num_segments, num_segments, c, h, w)
    padded = F.pad(clips, (0, 0, 0, 0, 0, 0, 1, 1))
    later, earlier = padded[:, 2:], padded[:, :-2]
    if reverse:
        later, earlier = earlier, later
    channel = torch.arange(c, device=x.device).view(c, 1, 1)
    out = torch.where(channel < fold, later, torch.where(channel < 2 * fold, earlier, clips))
    return out.reshape(nt, c, h, w).contiguous(memory_format=_memory_format(x))


@functools.lru_cache(maxsize=None)
def _compiled_where() -> ShiftKernel:
    # dynamic: one graph per direction for all shapes (stages, clip lengths, batches);
    # past Dynamo's recompile limit (dtypes, memory formats) calls run eagerly
    return torch.compile(_where, dynamic=True)


def _compiled(x: torch.Tensor, num_segments: int, fold: int, reverse: bool) -> torch.Tensor:
    """The ``"compiled"`` kernel: :func:`_where` through ``torch.compile``, eagerly where
    Dynamo does not run or is already tracing (an enclosing compile fuses it there)."""
    if torch.compiler.is_compiling() or not torch._dynamo.is_dynamo_supported():
        return _where(x, num_segments, fold, reverse)
    return _compiled_where()(x, num_segments, fold, reverse)


def _triton_runs_on(x: torch.Tensor) -> bool:
    if triton_shift is None or x.numel() > MAX_NUMEL:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _triton(x: torch.Tensor, num_segments: int, fold: int, reverse: bool) -> torch.Tensor:
    """The ``"triton"`` kernel; :func:`_slices` where Triton cannot run on ``x``."""
    if _triton_runs_on(x):
        return triton_shift(x, num_segments, fold, reverse)
    return _slices(x, num_segments, fold, reverse)


#: name -> kernel; the implementations of the shift (module docstring), all exact.
SHIFT_IMPLS: Dict[str, ShiftKernel] = {
    "slices": _slices,
    "triton": _triton,
    "compiled": _compiled,
}


class _TemporalShiftFn(torch.autograd.Function):
    """The shift with a given kernel; its gradient is the reverse shift with the same
    kernel, itself this function under ``create_graph`` (so differentiable again)."""

    @staticmethod
    def forward(ctx, x, num_segments: int, fold: int, kernel: ShiftKernel, reverse: bool):
        ctx.num_segments, ctx.fold, ctx.kernel, ctx.reverse = num_segments, fold, kernel, reverse
        return kernel(x.contiguous(memory_format=_memory_format(x)), num_segments, fold, reverse)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_out = grad_out.contiguous(memory_format=_memory_format(grad_out))
        args = (ctx.num_segments, ctx.fold, ctx.kernel, not ctx.reverse)
        if grad_out.requires_grad:
            grad_in = _TemporalShiftFn.apply(grad_out, *args)
        else:
            grad_in = ctx.kernel(grad_out, *args[:2], args[3])
        return grad_in, None, None, None, None


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def temporal_shift(
    x: torch.Tensor, num_segments: int, fold_div: int = 8, impl: str = "slices"
) -> torch.Tensor:
    """Shift channels of ``x`` along time, as defined in this module's docstring.

    Args:
        x: ``(N*T, C, H, W)``, the T frames of each clip consecutive on axis 0.
        num_segments: T, the number of frames per clip.
        fold_div: ``fold = C // fold_div`` channels move each way (8 in TSM:
            1/8 backward, 1/8 forward, 3/4 unchanged).
        impl: the implementation, a key of :data:`SHIFT_IMPLS` (the same values
            and gradients from each).

    Returns:
        A new tensor of the shape, dtype and memory format of ``x``;
        differentiable with respect to ``x``.
    """
    if x.dim() != 4:
        raise ValueError(f"temporal_shift expects (N*T, C, H, W), got shape {tuple(x.shape)}")
    if x.shape[0] % num_segments != 0:
        raise ValueError(
            f"batch axis {x.shape[0]} is not a multiple of num_segments={num_segments}"
        )
    if impl not in SHIFT_IMPLS:
        raise ValueError(f"Unknown shift implementation {impl!r}; one of {sorted(SHIFT_IMPLS)}")
    # int(): sizes are tensors while tracing (fvcore's FLOP count, torch.jit.trace).
    fold = int(x.shape[1]) // fold_div
    return _TemporalShiftFn.apply(x, int(num_segments), fold, SHIFT_IMPLS[impl], False)


class TemporalShift(torch.nn.Module):
    """Module form of :func:`temporal_shift` with a fixed ``num_segments``.

    The ResNet backbones here call :func:`temporal_shift` with the clip length of
    the batch at hand instead (clip lengths can change between batches); this
    wrapper is for inserting the shift into other networks.
    """

    def __init__(self, num_segments: int, fold_div: int = 8, impl: str = "slices"):
        super().__init__()
        if impl not in SHIFT_IMPLS:
            raise ValueError(f"Unknown shift implementation {impl!r}; one of {sorted(SHIFT_IMPLS)}")
        self.num_segments = num_segments
        self.fold_div = fold_div
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return temporal_shift(x, self.num_segments, self.fold_div, self.impl)

    def extra_repr(self) -> str:
        return f"num_segments={self.num_segments}, fold_div={self.fold_div}, impl={self.impl!r}"
