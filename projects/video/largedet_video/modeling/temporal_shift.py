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
"""

from __future__ import annotations

import torch

__all__ = ["temporal_shift", "TemporalShift"]


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


class _TemporalShiftFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, num_segments: int, fold: int) -> torch.Tensor:
        ctx.num_segments, ctx.fold = num_segments, fold
        x = x.contiguous(memory_format=_memory_format(x))
        nt, c, h, w = x.shape
        out = torch.empty_like(x)
        _shift_into(
            out.view(nt // num_segments, num_segments, c, h, w),
            x.view(nt // num_segments, num_segments, c, h, w),
            fold,
            backward=False,
        )
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        t, fold = ctx.num_segments, ctx.fold
        nt, c, h, w = grad_out.shape
        grad_out = grad_out.contiguous(memory_format=_memory_format(grad_out))
        grad_in = torch.empty_like(grad_out)
        _shift_into(
            grad_in.view(nt // t, t, c, h, w),
            grad_out.view(nt // t, t, c, h, w),
            fold,
            backward=True,
        )
        return grad_in, None, None


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def temporal_shift(x: torch.Tensor, num_segments: int, fold_div: int = 8) -> torch.Tensor:
    """Shift channels of ``x`` along time, as defined in this module's docstring.

    Args:
        x: ``(N*T, C, H, W)``, the T frames of each clip consecutive on axis 0.
        num_segments: T, the number of frames per clip.
        fold_div: ``fold = C // fold_div`` channels move each way (8 in TSM:
            1/8 backward, 1/8 forward, 3/4 unchanged).

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
    # int(): sizes are tensors while tracing (fvcore's FLOP count, torch.jit.trace).
    return _TemporalShiftFn.apply(x, int(num_segments), int(x.shape[1]) // fold_div)


class TemporalShift(torch.nn.Module):
    """Module form of :func:`temporal_shift` with a fixed ``num_segments``.

    The ResNet backbones here call :func:`temporal_shift` with the clip length of
    the batch at hand instead (clip lengths can change between batches); this
    wrapper is for inserting the shift into other networks.
    """

    def __init__(self, num_segments: int, fold_div: int = 8):
        super().__init__()
        self.num_segments = num_segments
        self.fold_div = fold_div

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return temporal_shift(x, self.num_segments, self.fold_div)

    def extra_repr(self) -> str:
        return f"num_segments={self.num_segments}, fold_div={self.fold_div}"
