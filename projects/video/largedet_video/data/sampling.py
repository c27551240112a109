"""Which frames of a video make a clip.

All functions return 0-based frame indices into a video of ``num_frames``
frames, as int64 arrays of length ``T`` (one clip) or ``(num_clips, T)``.
Videos shorter than a clip repeat frames; no index is ever out of range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ClipShape",
    "FrameSampling",
    "segment_train_indices",
    "segment_test_indices",
    "dense_train_indices",
    "dense_test_indices",
]


@dataclass(frozen=True)
class ClipShape:
    """The shape of one training clip: ``num_frames`` (T) frames of
    ``crop_size`` x ``crop_size`` pixels. A dataset takes one per sample, so a
    batch sampler can vary the shape from batch to batch."""

    num_frames: int
    crop_size: int


def _segment_bounds(num_frames: int, num_segments: int) -> np.ndarray:
    """Start of each of T equal segments, and the end: ``floor(i * n / T)``, i = 0..T."""
    return (np.arange(num_segments + 1) * num_frames) // num_segments


def segment_train_indices(
    num_frames: int, num_segments: int, rng: np.random.Generator
) -> np.ndarray:
    """TSN's training sampling: the video is cut into ``num_segments`` equal
    segments ``[floor(i n / T), floor((i + 1) n / T))`` and one frame is drawn
    uniformly from each. A segment shorter than one frame (n < T) gives its start."""
    bounds = _segment_bounds(num_frames, num_segments)
    starts, ends = bounds[:-1], np.maximum(bounds[1:], bounds[:-1] + 1)
    idx = starts + (rng.random(num_segments) * (ends - starts)).astype(np.int64)
    return np.minimum(idx, num_frames - 1).astype(np.int64)


def segment_test_indices(num_frames: int, num_segments: int, num_clips: int) -> np.ndarray:
    """Test clips for segment sampling, ``(num_clips, T)``: clip k takes the frame
    at ``floor((i + (k + 0.5) / num_clips) * n / T)`` in segment i, so the clips
    are evenly staggered through each segment (k = 0 of 1 clip is the centre)."""
    offsets = (np.arange(num_clips)[:, None] + 0.5) / num_clips
    pos = (np.arange(num_segments)[None, :] + offsets) * num_frames / num_segments
    return np.minimum(np.floor(pos).astype(np.int64), num_frames - 1)


def dense_train_indices(
    num_frames: int, num_samples: int, stride: int, rng: np.random.Generator
) -> np.ndarray:
    """Dense sampling: ``num_samples`` frames ``stride`` apart from a uniformly
    random start in ``[0, n - (T - 1) * stride - 1]`` (0 when the clip is longer
    than the video, whose last frame then repeats)."""
    span = (num_samples - 1) * stride + 1
    start = int(rng.integers(0, max(num_frames - span, 0) + 1))
    return np.minimum(start + np.arange(num_samples) * stride, num_frames - 1).astype(np.int64)


def dense_test_indices(
    num_frames: int, num_samples: int, stride: int, num_clips: int
) -> np.ndarray:
    """Test clips for dense sampling, ``(num_clips, T)``: starts evenly spread
    over ``[0, n - span]`` (``round(k * (n - span) / (num_clips - 1))``; one clip
    starts at the centre)."""
    span = (num_samples - 1) * stride + 1
    room = max(num_frames - span, 0)
    if num_clips == 1:
        starts = np.array([room // 2])
    else:
        starts = np.round(np.arange(num_clips) * room / (num_clips - 1)).astype(np.int64)
    idx = starts[:, None] + np.arange(num_samples)[None, :] * stride
    return np.minimum(idx, num_frames - 1).astype(np.int64)


@dataclass(frozen=True)
class FrameSampling:
    """A sampling rule: ``mode`` "segment" (TSN) or "dense" (``stride`` apart)."""

    mode: str = "segment"
    stride: int = 8

    def __post_init__(self):
        if self.mode not in ("segment", "dense"):
            raise ValueError(f"Frame sampling must be 'segment' or 'dense', got {self.mode!r}")

    def train(self, num_frames: int, clip_len: int, rng: np.random.Generator) -> np.ndarray:
        if self.mode == "segment":
            return segment_train_indices(num_frames, clip_len, rng)
        return dense_train_indices(num_frames, clip_len, self.stride, rng)

    def test(self, num_frames: int, clip_len: int, num_clips: int) -> np.ndarray:
        if self.mode == "segment":
            return segment_test_indices(num_frames, clip_len, num_clips)
        return dense_test_indices(num_frames, clip_len, self.stride, num_clips)
