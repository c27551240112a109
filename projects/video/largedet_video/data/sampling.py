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
    "window_segment_train_indices",
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


def window_segment_train_indices(
    num_frames: int, num_segments: int, stride: float, rng: np.random.Generator
) -> np.ndarray:
    """Segment sampling inside a window: ``num_segments`` segments of ``stride``
    frames (a real number) laid end to end from a uniformly random start in
    ``[0, n - num_segments * stride]``, one frame drawn uniformly from each. With
    ``stride = n / num_segments`` the window is the whole video and this is
    :func:`segment_train_indices` (up to rounding)."""
    span = min(num_segments * stride, num_frames)
    start = rng.random(1)[0] * (num_frames - span)
    pos = start + (np.arange(num_segments) + rng.random(num_segments)) * stride
    return np.clip(np.floor(pos).astype(np.int64), 0, num_frames - 1)


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

    def train_resampled(
        self, num_frames: int, clip_len: int, base_len: int, rng: np.random.Generator
    ) -> np.ndarray:
        """A training clip of ``clip_len`` frames for a model whose base clip has
        ``base_len`` frames (multigrid's shorter clips, Wu et al. 2020, Sec. 3.1):
        the temporal stride is drawn uniformly between the base stride and the base
        stride x ``base_len / clip_len``, so a short clip covers from as little as
        ``clip_len`` base-rate frames up to the whole time span of a base clip.

        "dense": an integer stride in ``[stride, round(stride * base_len / clip_len)]``.
        "segment": the base stride is the base segment length ``n / base_len``, so the
        stride is in ``[n / base_len, n / clip_len]``, and the clip is segment-sampled
        inside a window of ``clip_len`` strides at a random place in the video (at the
        largest stride the window is the whole video, as for a base clip).
        ``clip_len >= base_len`` is ordinary sampling (:meth:`train`).
        """
        if clip_len >= base_len:
            return self.train(num_frames, clip_len, rng)
        ratio = base_len / clip_len
        if self.mode == "dense":
            stride = int(rng.integers(self.stride, int(round(self.stride * ratio)) + 1))
            return dense_train_indices(num_frames, clip_len, stride, rng)
        base_stride = num_frames / base_len
        stride = base_stride * (1.0 + rng.random(1)[0] * (ratio - 1.0))
        return window_segment_train_indices(num_frames, clip_len, stride, rng)

    def test(self, num_frames: int, clip_len: int, num_clips: int) -> np.ndarray:
        if self.mode == "segment":
            return segment_test_indices(num_frames, clip_len, num_clips)
        return dense_test_indices(num_frames, clip_len, self.stride, num_clips)
