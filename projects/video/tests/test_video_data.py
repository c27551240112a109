"""Lists, decoders, the dataset's samples and views, unreadable videos, the
generated dataset, and the loaders."""

import logging
import os

import cv2
import numpy as np
import pytest
import torch
from largedet.data.build import ResumableTrainingSampler
from torch.utils.data import BatchSampler, DataLoader

from largedet_video.data import (
    ClipShape,
    MovingShapesSpec,
    TestViews,
    TrainAugmentation,
    VideoDataset,
    VideoDecodeError,
    load_kinetics_csv,
    load_video_list,
    open_video,
    prepare_moving_shapes,
)
from largedet_video.data.build import VideoTrainLoader
from largedet_video.data.lists import kinetics_file_name
from largedet_video.data.moving_shapes import load_moving_shapes, render_moving_shape, write_mp4

# --- lists ----------------------------------------------------------------------


def test_video_list_formats(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("# comment\n" "a/x.mp4 3\n" "\n" "frames/y 120 7\n" "with space/z.mp4, 1\n")
    assert load_video_list(str(lst), "/root") == [
        {"path": "/root/a/x.mp4", "label": 3},
        {"path": "/root/frames/y", "label": 7, "num_frames": 120},
        {"path": "/root/with space/z.mp4", "label": 1},
    ]
    lst.write_text("a.mp4 3 4 5\n")
    with pytest.raises(ValueError, match="list.txt:1"):
        load_video_list(str(lst))
    lst.write_text("a.mp4 dog\n")
    with pytest.raises(ValueError, match="list.txt:1"):
        load_video_list(str(lst))


def test_kinetics_csv(tmp_path, caplog):
    assert kinetics_file_name("abc-_12", 14, 24) == "abc-_12_000014_000024.mp4"
    csv_file = tmp_path / "validate.csv"
    csv_file.write_text(
        "label,youtube_id,time_start,time_end,split\n"
        "zumba,id1,0,10,val\n"
        "air drumming,id2,5,15,val\n"
        "zumba,id3,30,40,val\n"
    )
    videos = tmp_path / "val"
    (videos / "air drumming").mkdir(parents=True)
    (videos / "id1_000000_000010.mp4").write_bytes(b"")
    (videos / "air drumming" / "id2_000005_000015.mp4").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        records, classes = load_kinetics_csv(str(csv_file), str(videos))
    assert classes == ["air drumming", "zumba"]
    assert records == [
        {"path": str(videos / "id1_000000_000010.mp4"), "label": 1},
        {"path": str(videos / "air drumming" / "id2_000005_000015.mp4"), "label": 0},
    ]
    assert "1 of 3 clips not found" in caplog.text
    records, _ = load_kinetics_csv(str(csv_file), str(videos), ["a", "air drumming", "zumba"])
    assert [r["label"] for r in records] == [2, 1]


# --- decoding -------------------------------------------------------------------


@pytest.fixture(scope="module")
def coded_video(tmp_path_factory):
    """A 20-frame MP4 whose frame i is flat grey 10 * i, and the frames written."""
    frames = np.repeat(np.arange(20, dtype=np.uint8)[:, None, None, None] * 10, 3, axis=3)
    frames = np.ascontiguousarray(np.broadcast_to(frames, (20, 32, 48, 3)))
    path = str(tmp_path_factory.mktemp("video") / "ramp.mp4")
    write_mp4(path, frames, fps=10)
    return path, frames


@pytest.mark.parametrize("decoder", ["pyav", "opencv"])
def test_decoders_read_the_requested_frames(coded_video, decoder):
    path, frames = coded_video
    with open_video(path, decoder) as video:
        assert video.num_frames == 20
        out = video.read(np.array([7, 0, 19, 7]))
    assert out.shape == (4, 32, 48, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - frames[[7, 0, 19, 7]].astype(int)).max() <= 3


def test_frame_folder_and_past_the_end_indices(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(5):
        cv2.imwrite(str(folder / f"img_{i + 1:05d}.png"), np.full((4, 6, 3), i, np.uint8))
    with open_video(str(folder)) as video:
        assert video.num_frames == 5
        assert video.read(np.array([4, 1]))[:, 0, 0, 0].tolist() == [4, 1]
    with pytest.raises(VideoDecodeError):
        open_video(str(tmp_path))  # a folder without images


# --- the dataset ----------------------------------------------------------------


@pytest.fixture(scope="module")
def stamped_frames(tmp_path_factory):
    """A 40-frame PNG folder, 72 x 96: red = frame index, green = column // 4."""
    folder = tmp_path_factory.mktemp("stamped")
    cols = (np.arange(96) // 4).astype(np.uint8)
    for i in range(40):
        img = np.zeros((72, 96, 3), np.uint8)
        img[..., 0] = i
        img[..., 1] = cols[None, :]
        cv2.imwrite(str(folder / f"{i:05d}.png"), img[..., ::-1])
    return str(folder)


def test_ten_clips_three_crops_test_views(stamped_frames):
    ds = VideoDataset(
        [{"path": stamped_frames, "label": 2}],
        is_train=False,
        clip_shape=ClipShape(4, 72),
        test_views=TestViews(num_clips=10, num_crops=3, short_side=72, crop_size=72),
    )
    sample = ds[0]
    clip = sample["clip"]
    assert clip.shape == (30, 4, 3, 72, 72) and clip.dtype == torch.uint8
    assert sample["valid"] and sample["label"] == 2 and sample["index"] == 0
    # 40 frames, 4 segments of 10: clip k takes frames 10 i + k.
    # Crops at x = 0, 12, 24 (72-pixel squares in a 96-pixel-wide frame): green = x // 4.
    for k in range(10):
        for c, x0 in enumerate((0, 12, 24)):
            view = clip[3 * k + c]
            assert view[:, 0, 0, 0].tolist() == [10 * i + k for i in range(4)]
            assert view[0, 1, 0, 0].item() == x0 // 4


def test_training_sample_shape_and_requested_shape(stamped_frames):
    ds = VideoDataset(
        [{"path": stamped_frames, "label": 1}],
        is_train=True,
        clip_shape=ClipShape(8, 32),
        augmentation=TrainAugmentation(scales=(1.0, 0.875), max_distort=1, flip=True),
    )
    sample = ds[0]
    assert sample["clip"].shape == (8, 3, 32, 32) and sample["num_skipped"] == 0
    frame_ids = sample["clip"][:, 0, 0, 0].tolist()
    assert all(5 * i <= f < 5 * (i + 1) for i, f in enumerate(frame_ids))
    assert ds[(0, ClipShape(4, 16))]["clip"].shape == (4, 3, 16, 16)


def test_unreadable_videos_are_skipped_counted_and_logged(unreadable_records, coded_video, caplog):
    records = unreadable_records(coded_video[0])
    kw = dict(clip_shape=ClipShape(4, 16), augmentation=TrainAugmentation(flip=False))
    train = VideoDataset(records, is_train=True, **kw)
    with caplog.at_level(logging.WARNING):
        sample = train[0]
    assert sample["label"] == 2 and sample["num_skipped"] == 2
    assert train.num_skipped == 2
    assert "corrupt.mp4" in caplog.text and "missing.mp4" in caplog.text

    # The loader reports the total it saw.
    sampler = ResumableTrainingSampler(len(train), shuffle=False, seed=0)
    loader = VideoTrainLoader(
        DataLoader(train, batch_sampler=BatchSampler(sampler, 4, True)), sampler
    )
    batch = next(iter(loader))
    assert "num_skipped" not in batch and batch["clip"].shape == (4, 4, 3, 16, 16)
    assert loader.num_skipped >= 3

    # At test time the video is marked invalid instead.
    test = VideoDataset(
        records, is_train=False, clip_shape=ClipShape(4, 16), test_views=TestViews(2, 1, 16, 16)
    )
    bad = test[0]
    assert bad["valid"] is False and bad["clip"].shape == (2, 4, 3, 16, 16)
    assert test[2]["valid"] is True

    # Nothing readable at all: a clear error after a bounded number of tries.
    hopeless = VideoDataset(records[:2] * 3, is_train=True, max_consecutive_skips=4, **kw)
    with pytest.raises(RuntimeError, match="5 unreadable videos in a row"):
        hopeless[0]


# --- the generated dataset ------------------------------------------------------


def test_moving_shapes_are_seeded_and_move_in_their_direction():
    spec = MovingShapesSpec(num_frames=6, width=48, height=32)
    a = render_moving_shape(np.random.default_rng(3), "left", spec)
    b = render_moving_shape(np.random.default_rng(3), "left", spec)
    assert a.shape == (6, 32, 48, 3) and np.array_equal(a, b)
    # Same draws, other direction: identical first frame, different motion.
    c = render_moving_shape(np.random.default_rng(3), "right", spec)
    assert np.array_equal(a[0], c[0]) and not np.array_equal(a[-1], c[-1])


def test_prepared_dataset_lists_and_cache(tiny_shapes, tiny_shapes_spec):
    train = load_moving_shapes(tiny_shapes, "train")
    val = load_moving_shapes(tiny_shapes, "val")
    assert len(train) == 8 and len(val) == 4
    assert [r["label"] for r in train] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert train[0]["path"] == os.path.join(tiny_shapes, "videos", "train", "000000.mp4")
    with open(os.path.join(tiny_shapes, "train.txt")) as f:
        assert f.readline() == "videos/train/000000.mp4 0\n"
    with open_video(train[5]["path"]) as video:
        assert video.num_frames == 12
        assert video.read(np.array([0])).shape == (1, 32, 48, 3)
    stamp = os.path.getmtime(train[0]["path"])
    root = os.path.dirname(tiny_shapes)
    assert prepare_moving_shapes(tiny_shapes_spec, root) == tiny_shapes
    assert os.path.getmtime(train[0]["path"]) == stamp
    assert sorted(os.listdir(root)) == [os.path.basename(tiny_shapes)]  # no temporary left
