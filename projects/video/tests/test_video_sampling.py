"""Frame indices and crop boxes, computed by hand."""

import numpy as np
import pytest

from largedet_video.data.sampling import (
    FrameSampling,
    dense_test_indices,
    dense_train_indices,
    segment_test_indices,
    segment_train_indices,
)
from largedet_video.data.transforms import CropBox, multi_scale_crop_box, view_crop_boxes


class FixedRng:
    """Stands in for np.random.Generator with chosen draws."""

    def __init__(self, uniforms=(), integer_picks=()):
        self._uniforms = list(uniforms)
        self._picks = list(integer_picks)

    def random(self, size):
        out, self._uniforms = self._uniforms[:size], self._uniforms[size:]
        return np.array(out)

    def integers(self, low, high=None):
        if high is None:
            low, high = 0, low
        pick = self._picks.pop(0)  # "lo", "hi" (the largest allowed) or an int
        return {"lo": low, "hi": high - 1}.get(pick, pick)


def test_segment_train_indices():
    # 16 frames, 4 segments [0,4) [4,8) [8,12) [12,16); draws 0, .5, .99, .25.
    idx = segment_train_indices(16, 4, FixedRng([0.0, 0.5, 0.99, 0.25]))
    assert idx.tolist() == [0, 6, 11, 13]
    # 10 frames: bounds floor(i * 10 / 4) = 0, 2, 5, 7, 10.
    idx = segment_train_indices(10, 4, FixedRng([0.0, 0.5, 0.99, 0.5]))
    assert idx.tolist() == [0, 3, 6, 8]
    # 3 frames for 4 segments: bounds 0, 0, 1, 2, 3; an empty segment gives its start.
    idx = segment_train_indices(3, 4, FixedRng([0.99] * 4))
    assert idx.tolist() == [0, 0, 1, 2]


def test_segment_train_indices_stay_in_their_segments():
    rng = np.random.default_rng(0)
    for n in (8, 9, 31, 250):
        for _ in range(50):
            idx = segment_train_indices(n, 8, rng)
            bounds = (np.arange(9) * n) // 8
            assert ((idx >= bounds[:-1]) & (idx < bounds[1:])).all()


def test_segment_test_indices():
    assert segment_test_indices(16, 4, 1).tolist() == [[2, 6, 10, 14]]
    assert segment_test_indices(16, 4, 2).tolist() == [[1, 5, 9, 13], [3, 7, 11, 15]]
    # The 10-clip test on 80 frames, 8 segments of 10: clip k takes frame 10 i + k.
    ten = segment_test_indices(80, 8, 10)
    assert ten.shape == (10, 8)
    assert ten.tolist() == [[10 * i + k for i in range(8)] for k in range(10)]
    assert segment_test_indices(3, 4, 1).tolist() == [[0, 1, 1, 2]]


def test_dense_indices():
    # 100 frames, 4 samples 8 apart: span 25, start in [0, 75].
    assert dense_train_indices(100, 4, 8, FixedRng(integer_picks=["hi"])).tolist() == [
        75,
        83,
        91,
        99,
    ]
    assert dense_train_indices(100, 4, 8, FixedRng(integer_picks=["lo"])).tolist() == [0, 8, 16, 24]
    # Shorter than the span: start 0, the last frame repeats.
    assert dense_train_indices(10, 4, 8, FixedRng(integer_picks=["hi"])).tolist() == [0, 8, 9, 9]
    assert dense_test_indices(100, 4, 8, 3).tolist() == [
        [0, 8, 16, 24],
        [38, 46, 54, 62],
        [75, 83, 91, 99],
    ]
    assert dense_test_indices(100, 4, 8, 1).tolist() == [[37, 45, 53, 61]]


def test_frame_sampling_dispatch_and_validation():
    assert FrameSampling("dense", 2).test(10, 3, 1).tolist() == [[2, 4, 6]]
    assert FrameSampling("segment").test(16, 4, 1).tolist() == [[2, 6, 10, 14]]
    with pytest.raises(ValueError):
        FrameSampling("uniform")


def test_multi_scale_crop_box():
    # 72 x 96 frame, short side 72: sides int(72 * s) = 72, 63, 54 for scales 1, .875, .75.
    # max_distort 1 allows pairs (w, h) with indices at most 1 apart: 7 pairs.
    scales = (1.0, 0.875, 0.75)
    pairs = [(72, 72), (72, 63), (63, 72), (63, 63), (63, 54), (54, 63), (54, 54)]
    for k, (w, h) in enumerate(pairs):
        box = multi_scale_crop_box(72, 96, scales, 1, FixedRng(integer_picks=[k, "hi", "lo"]))
        assert box == CropBox(x=96 - w, y=0, w=w, h=h)
    with pytest.raises(IndexError):
        multi_scale_crop_box(72, 96, scales, 1, FixedRng(integer_picks=[7, 0, 0]))


def test_view_crop_boxes():
    # 72 x 96 to short side 64 with 64 crops: a 72-pixel square in source pixels,
    # at the left, centre and right of the long side.
    assert view_crop_boxes(72, 96, 64, 64, 3) == [
        CropBox(0, 0, 72, 72),
        CropBox(12, 0, 72, 72),
        CropBox(24, 0, 72, 72),
    ]
    # 256 x 340 to short side 256, 224 crops, centre only.
    assert view_crop_boxes(256, 340, 256, 224, 1) == [CropBox(58, 16, 224, 224)]
    # Portrait: crops move along the height.
    assert view_crop_boxes(96, 72, 72, 72, 3) == [
        CropBox(0, 0, 72, 72),
        CropBox(0, 12, 72, 72),
        CropBox(0, 24, 72, 72),
    ]
    with pytest.raises(ValueError):
        view_crop_boxes(72, 96, 64, 80, 1)
