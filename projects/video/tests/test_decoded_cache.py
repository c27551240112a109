"""INPUT.VIDEO.DECODED_CACHE_MB: whole decoded videos kept in memory give exactly the
clips, views and skips of reading the files, within the byte budget."""

import cv2
import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from largedet.config.validate import ConfigError, check_values, merge_checked

from largedet_video import add_video_config
from largedet_video.engine.checks import VIDEO_RULES
from largedet_video.data import ClipShape, TestViews, TrainAugmentation, VideoDataset, VideoDecodeError
from largedet_video.data.dataset import DecodedVideoCache
from largedet_video.data.moving_shapes import load_moving_shapes, write_mp4

AUG = TrainAugmentation(scales=(1.0, 0.875, 0.75), max_distort=1, flip=True)


def _train_pass(ds, seed, passes=2):
    """Training samples of every index, ``passes`` times, from numpy's global seed."""
    np.random.seed(seed)
    return [ds[i] for _ in range(passes) for i in range(len(ds))]


@pytest.mark.parametrize("decoder", ["opencv", "pyav"])
def test_cached_training_clips_and_test_views_equal_the_files(tiny_shapes, decoder):
    records = load_moving_shapes(tiny_shapes, "train")
    kw = dict(is_train=True, clip_shape=ClipShape(4, 24), augmentation=AUG, decoder=decoder)
    plain = _train_pass(VideoDataset(records, **kw), seed=7)
    cached_ds = VideoDataset(records, decoded_cache_mb=64, **kw)
    cached = _train_pass(cached_ds, seed=7)
    assert len(plain) == len(cached) == 2 * len(records)
    for a, b in zip(plain, cached):
        assert a["label"] == b["label"] and torch.equal(a["clip"], b["clip"])
    cache = cached_ds.cache
    # the first pass decodes each video whole once; the second reads memory only
    assert (cache.misses, cache.hits, len(cache)) == (len(records), len(records), len(records))
    assert cache.bytes == len(records) * 12 * 32 * 48 * 3 and not cache.full  # 12 frames of 48 x 32

    views = TestViews(num_clips=3, num_crops=3, short_side=32, crop_size=24)
    val = load_moving_shapes(tiny_shapes, "val")
    kw = dict(is_train=False, clip_shape=ClipShape(4, 24), test_views=views, decoder=decoder)
    plain_test, cached_test = VideoDataset(val, **kw), VideoDataset(val, decoded_cache_mb=64, **kw)
    for _ in range(2):
        for i in range(len(val)):
            a, b = plain_test[i], cached_test[i]
            assert a["valid"] and b["valid"] and torch.equal(a["clip"], b["clip"])
    assert cached_test.cache.hits == len(val)


def test_a_video_past_the_budget_is_read_from_its_file(tiny_shapes):
    records = load_moving_shapes(tiny_shapes, "train")[:4]
    video_bytes = 12 * 32 * 48 * 3
    ds = VideoDataset(
        records, is_train=True, clip_shape=ClipShape(4, 24), augmentation=AUG, decoder="opencv"
    )
    ds.cache = DecodedVideoCache(int(2.5 * video_bytes))
    plain = VideoDataset(
        records, is_train=True, clip_shape=ClipShape(4, 24), augmentation=AUG, decoder="opencv"
    )
    for a, b in zip(_train_pass(plain, seed=3, passes=3), _train_pass(ds, seed=3, passes=3)):
        assert torch.equal(a["clip"], b["clip"])
    # two videos fit; the third filled it; the rest were never decoded whole
    assert len(ds.cache) == 2 and ds.cache.full and ds.cache.bytes == 2 * video_bytes
    assert ds.cache.hits == 2 * 2 and ds.cache.misses == 4 + 2 * 2


def test_unreadable_videos_are_skipped_alike_and_never_kept(unreadable_records, tiny_shapes):
    records = unreadable_records(load_moving_shapes(tiny_shapes, "train")[0]["path"])
    kw = dict(is_train=True, clip_shape=ClipShape(4, 16), augmentation=AUG, decoder="pyav")
    plain, cached = VideoDataset(records, **kw), VideoDataset(records, decoded_cache_mb=16, **kw)
    for a, b in zip(_train_pass(plain, seed=1), _train_pass(cached, seed=1)):
        assert (a["label"], a["num_skipped"]) == (b["label"], b["num_skipped"])
        assert torch.equal(a["clip"], b["clip"])
    assert plain.num_skipped == cached.num_skipped > 0
    assert len(cached.cache) == 1  # only the readable video

    views = TestViews(2, 1, 16, 16)
    test = VideoDataset(
        records, is_train=False, clip_shape=ClipShape(4, 16), test_views=views, decoded_cache_mb=16
    )
    assert test[0]["valid"] is False and test[2]["valid"] is True and len(test.cache) == 1


def test_a_video_that_fails_past_the_clip_is_read_as_without_a_cache(tmp_path):
    """A frame folder whose last frame is unreadable: decoding it whole fails, yet
    the frames a clip asks for are read from the files, as without a cache."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(9):
        cv2.imwrite(str(folder / f"{i:05d}.png"), np.full((4, 6, 3), 10 * i, np.uint8))
    (folder / "00009.png").write_bytes(b"not a png")
    cache = DecodedVideoCache(2**20)
    record = {"path": str(folder), "label": 0}
    with cache.open(record, "opencv") as video:
        assert video.num_frames == 10
        assert video.read(np.array([8, 0, 3]))[:, 0, 0, 0].tolist() == [80, 0, 30]
    assert len(cache) == 0 and cache.misses == 1 and not cache.full
    # not decoded whole again: the next read goes to the files directly
    cache._decode_whole = None  # calling it would raise TypeError
    with pytest.raises(VideoDecodeError):
        with cache.open(record, "opencv") as video:
            video.read(np.array([9]))
    assert cache.misses == 2 and len(cache) == 0


def test_a_record_count_past_the_header_is_decoded_to_it(tmp_path):
    """A list file's frame count above the container's: indices past the stream's
    last frame get the last frame, cached or not."""
    frames = np.repeat(np.arange(10, dtype=np.uint8)[:, None, None, None] * 20, 3, axis=3)
    path = str(tmp_path / "ramp.mp4")
    write_mp4(path, np.ascontiguousarray(np.broadcast_to(frames, (10, 32, 48, 3))), fps=10)
    record = {"path": path, "label": 0, "num_frames": 14}
    kw = dict(is_train=True, clip_shape=ClipShape(7, 16), augmentation=AUG, decoder="opencv")
    plain, cached = VideoDataset([record], **kw), VideoDataset([record], decoded_cache_mb=8, **kw)
    a, b = _train_pass(plain, seed=5, passes=6), _train_pass(cached, seed=5, passes=6)
    assert all(torch.equal(x["clip"], y["clip"]) for x, y in zip(a, b))
    assert len(cached.cache) == 1 and cached.cache.bytes == 14 * 32 * 48 * 3  # 14 frames kept


def test_the_budget_key_is_checked_before_launch():
    cfg = add_video_config(get_cfg())
    assert cfg.INPUT.VIDEO.DECODED_CACHE_MB == 0
    merge_checked(cfg, None, ["INPUT.VIDEO.DECODED_CACHE_MB", "-1"])
    with pytest.raises(ConfigError, match=r"INPUT\.VIDEO\.DECODED_CACHE_MB.*an integer >= 0"):
        check_values(cfg, VIDEO_RULES)
