"""Multigrid resampling of training clips: fewer frames at a random longer
stride (the clip still within the video and at most a base clip's span),
smaller crops of the same field of view."""

import cv2
import numpy as np
import pytest
import torch

from largedet_video.data import ClipShape, FrameSampling, TrainAugmentation, VideoDataset
from largedet_video.data.sampling import window_segment_train_indices


def test_dense_resampled_stride_range():
    # Base: 8 frames at stride 2; 2 frames: stride uniformly in [2, 2 * 8 / 2] = [2, 8].
    sampling, rng = FrameSampling("dense", 2), np.random.default_rng(0)
    strides = set()
    for _ in range(400):
        idx = sampling.train_resampled(64, 2, 8, rng)
        assert len(idx) == 2 and 0 <= idx.min() and idx.max() < 64
        strides.add(int(idx[1] - idx[0]))
    assert strides == set(range(2, 9))
    # 4 frames: [2, 4].
    gaps = {int(g) for _ in range(200) for g in np.diff(sampling.train_resampled(64, 4, 8, rng))}
    assert gaps == {2, 3, 4}


def test_segment_resampled_window_and_stride():
    # 32 frames, base 8 segments of 4 frames; 2 frames: stride in [4, 16], so the
    # window of 2 strides spans 8 to 32 frames, always inside the video.
    sampling, rng = FrameSampling("segment"), np.random.default_rng(1)
    spreads = []
    for _ in range(2000):
        idx = sampling.train_resampled(32, 2, 8, rng)
        assert len(idx) == 2 and 0 <= idx[0] <= idx[1] < 32
        spreads.append(idx[1] - idx[0])
    # Two frames of consecutive segments of length r are less than 2r apart, r <= 16;
    # the largest strides reach across most of the video, the smallest stay local.
    assert max(spreads) >= 28 and min(spreads) <= 1
    assert np.mean(np.array(spreads) <= 8) > 0.2


def test_window_segment_indices_by_hand():
    class Draws:
        def __init__(self, values):
            self.values = list(values)

        def random(self, size):
            out, self.values = self.values[:size], self.values[size:]
            return np.array(out)

    # 32 frames, 2 segments of 6: window 12 from 0.5 * (32 - 12) = 10: segments
    # [10, 16), [16, 22); draws 0.5 and 0 -> 13, 16.
    assert window_segment_train_indices(32, 2, 6.0, Draws([0.5, 0.5, 0.0])).tolist() == [13, 16]
    # The whole video (stride n / segments) is TSN's segment sampling.
    assert window_segment_train_indices(32, 4, 8.0, Draws([0.3, 0, 0.5, 0.99, 0])).tolist() == [
        0,
        12,
        23,
        24,
    ]


def test_base_shape_sampling_unchanged():
    for mode in ("segment", "dense"):
        sampling = FrameSampling(mode, 2)
        a = sampling.train_resampled(40, 8, 8, np.random.default_rng(3))
        b = sampling.train(40, 8, np.random.default_rng(3))
        assert a.tolist() == b.tolist()


@pytest.fixture(scope="module")
def stamped_frames(tmp_path_factory):
    """A 32-frame PNG folder, 36 x 48: red = frame index, green = column."""
    folder = tmp_path_factory.mktemp("stamped_mg")
    for i in range(32):
        img = np.zeros((36, 48, 3), np.uint8)
        img[..., 0] = i
        img[..., 1] = np.arange(48, dtype=np.uint8)[None, :] * 5
        cv2.imwrite(str(folder / f"{i:05d}.png"), img[..., ::-1])
    return str(folder)


def test_dataset_resamples_to_the_requested_shape(stamped_frames):
    ds = VideoDataset(
        [{"path": stamped_frames, "label": 0}],
        is_train=True,
        clip_shape=ClipShape(8, 32),
        augmentation=TrainAugmentation(scales=(1.0,), max_distort=0, flip=False),
    )
    base = ds[0]["clip"]
    assert base.shape == (8, 3, 32, 32)
    spans = []
    for _ in range(60):
        clip = ds[(0, ClipShape(2, 16))]["clip"]
        assert clip.shape == (2, 3, 16, 16) and clip.dtype == torch.uint8
        frame_ids = clip[:, 0, 0, 0].tolist()
        assert 0 <= frame_ids[0] <= frame_ids[1] < 32
        spans.append(frame_ids[1] - frame_ids[0])
        # Scale 1.0 of the short side (36): a 36 x 36 box, resized to 16 or 32, shows
        # the same field of view: the green ramp covers the same columns at half the size.
        ramp = clip[0, 1, 0].float()
        ramp_base = base[0, 1, 0].float()
        assert abs((ramp[-1] - ramp[0]) - (ramp_base[-1] - ramp_base[0])).item() <= 15
    assert max(spans) > 8  # strides beyond the base stride of 4
    assert ds[(0, ClipShape(4, 22))]["clip"].shape == (4, 3, 22, 22)
