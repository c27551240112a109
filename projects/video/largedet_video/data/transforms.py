"""Spatial transforms of clips: TSN's multi-scale crop and flip for training, and
the 1- or 3-crop test views.

A clip is a uint8 array ``(T, H, W, 3)``; the same crop applies to all its
frames. Crops are chosen in the coordinates of the decoded frames and each crop
is resized once to its output size (cheaper than resizing whole frames first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import cv2
import numpy as np

__all__ = ["CropBox", "multi_scale_crop_box", "view_crop_boxes", "crop_and_resize"]


@dataclass(frozen=True)
class CropBox:
    """A crop in pixels of the source frame: top-left ``(x, y)``, size ``(w, h)``."""

    x: int
    y: int
    w: int
    h: int


def multi_scale_crop_box(
    height: int,
    width: int,
    scales: Sequence[float],
    max_distort: int,
    rng: np.random.Generator,
) -> CropBox:
    """TSN's multi-scale crop: with ``s = min(height, width)``, candidate sides are
    ``int(s * scale)`` for each scale; width and height are drawn from pairs of
    candidates at most ``max_distort`` positions apart in ``scales``, and the crop
    is placed uniformly at random inside the frame."""
    short = min(height, width)
    sides = [max(1, int(short * s)) for s in scales]
    pairs = [
        (cw, ch)
        for i, cw in enumerate(sides)
        for j, ch in enumerate(sides)
        if abs(i - j) <= max_distort
    ]
    cw, ch = pairs[int(rng.integers(len(pairs)))]
    x = int(rng.integers(0, width - cw + 1))
    y = int(rng.integers(0, height - ch + 1))
    return CropBox(x, y, cw, ch)


def view_crop_boxes(
    height: int, width: int, short_side: int, crop_size: int, num_crops: int
) -> List[CropBox]:
    """The test crops: frames are (virtually) resized to ``short_side`` on their
    short side, and ``num_crops`` squares of ``crop_size`` are taken, centred on
    the short axis and evenly spaced along the long axis (1: the centre; 3: both
    ends and the centre). Returned in source-frame pixels."""
    if crop_size > short_side:
        raise ValueError(f"Test crop {crop_size} is larger than the short side {short_side}")
    side = int(round(crop_size * min(height, width) / short_side))
    long_len, short_len = max(height, width), min(height, width)
    across = (short_len - side) // 2
    if num_crops == 1:
        along = [(long_len - side) // 2]
    else:
        along = [int(round(k * (long_len - side) / (num_crops - 1))) for k in range(num_crops)]
    if width >= height:
        return [CropBox(a, across, side, side) for a in along]
    return [CropBox(across, a, side, side) for a in along]


def crop_and_resize(frames: np.ndarray, box: CropBox, size: int, flip: bool = False) -> np.ndarray:
    """Crop ``frames`` (T, H, W, 3) to ``box``, resize to ``size`` x ``size``
    (bilinear; area when shrinking), optionally mirror left-right; returns
    ``(T, size, size, 3)`` uint8."""
    crop = frames[:, box.y : box.y + box.h, box.x : box.x + box.w]
    interp = cv2.INTER_AREA if box.w > size and box.h > size else cv2.INTER_LINEAR
    out = np.empty((frames.shape[0], size, size, 3), dtype=np.uint8)
    for t in range(frames.shape[0]):
        src = crop[t]
        if (box.w, box.h) == (size, size):
            out[t] = src
        else:
            out[t] = cv2.resize(src, (size, size), interpolation=interp)
    if flip:
        out = np.ascontiguousarray(out[:, :, ::-1])
    return out
