"""The temporal shift as one Triton kernel per direction (see :mod:`.temporal_shift`).

The kernel sees the tensor as ``R`` rows of ``L`` contiguous elements: rows
``(n*T + t, c)`` of ``H*W`` pixels for ``(N*T, C, H, W)`` contiguous tensors, rows
``(n*T + t, h, w)`` of ``C`` channels for channels-last ones. A program copies a tile of
whole rows (or a block of one long row): it finds each row's frame ``t`` (and, in the
contiguous layout, its channel ``c``) once, reads from one frame later (``c < fold``),
one frame earlier (``fold <= c < 2 fold``) or the same frame, and writes 0 where that
frame falls outside the clip. A frame is ``C*H*W`` elements in both layouts, so the
source of every element is its own offset plus ``-1``, ``0`` or ``+1`` frames.

It reads every input element once and writes every output element once, the minimum
traffic of an out-of-place shift, in one launch (the slice form takes five), with no
per-element division. Offsets are 32-bit: tensors hold fewer than ``2**31`` elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["triton_shift", "MAX_NUMEL"]

MAX_NUMEL = 2**31 - 1
#: elements per program
TILE = 2048


# Sizes change from block to block: only the row length is specialized (its
# alignment lets the contiguous layout's loads and stores be vectorized).
@triton.jit(do_not_specialize=["rows", "rows_per_frame", "channels", "frames", "frame", "fold", "step"])
def _shift_kernel(
    x_ptr, out_ptr, rows, row_len, rows_per_frame, channels, frames, frame, fold, step,
    CHANNELS_LAST: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    col = tl.program_id(1) * COLS + tl.arange(0, COLS)[None, :]
    inside = (r < rows) & (col < row_len)
    t = (r // rows_per_frame) % frames
    if CHANNELS_LAST:
        c = col
    else:
        c = r % channels
    # Frames to look ahead: +step for the first fold channels, -step for the next fold.
    d = tl.where(c < fold, step, tl.where(c < 2 * fold, -step, 0))
    valid = inside & (t + d >= 0) & (t + d < frames)
    offs = r * row_len + col
    values = tl.load(x_ptr + offs + d * frame, mask=valid, other=0)
    tl.store(out_ptr + offs, values, mask=inside)


def triton_shift(x: torch.Tensor, num_segments: int, fold: int, reverse: bool) -> torch.Tensor:
    """The shift of ``x`` ``(N*T, C, H, W)``, contiguous or channels-last contiguous,
    into a new tensor of the same memory format; ``reverse`` swaps the two directions
    (the gradient). ``x`` must be on a device Triton runs on and hold at most
    :data:`MAX_NUMEL` elements."""
    nt, c, h, w = x.shape
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    # With one pixel the two layouts are the same memory: take rows of C channels.
    channels_last = h * w == 1 or (c > 1 and x.stride(1) == 1)
    row_len, rows_per_frame = (c, h * w) if channels_last else (h * w, c)
    rows = x.numel() // row_len
    cols = min(max(triton.next_power_of_2(row_len), 16), TILE // 2)
    tile_rows = TILE // cols
    grid = (triton.cdiv(rows, tile_rows), triton.cdiv(row_len, cols))
    _shift_kernel[grid](
        x, out, rows, row_len, rows_per_frame, c, num_segments, c * h * w, fold,
        -1 if reverse else 1, CHANNELS_LAST=channels_last, ROWS=tile_rows, COLS=cols,
    )  # fmt: skip
    return out
