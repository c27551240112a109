"""The torchcodec decoder against the decoding contract: the same frames as PyAV
(bit for bit on the built-in moving-shapes videos), frame-exact indices across
key frames, corrupt files raising VideoDecodeError and skipped by the dataset,
and a clear error when torchcodec or its FFmpeg libraries are missing."""

import os
import sys
import types

import av
import numpy as np
import pytest
import torch
from largedet_video.data import ClipShape, TestViews, TrainAugmentation, VideoDataset, decoding
from largedet_video.data.decoding import VideoDecodeError, open_video, torchcodec_unavailable
from largedet_video.data.moving_shapes import (
    MovingShapesSpec,
    load_moving_shapes,
    render_moving_shape,
    write_mp4,
)

needs_torchcodec = pytest.mark.skipif(
    torchcodec_unavailable() is not None, reason=f"torchcodec: {torchcodec_unavailable()}"
)


def _write_h264(path, frames, options, container_options=None):
    with av.open(path, "w", options=container_options or {}) as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = options
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


@pytest.fixture(scope="module")
def ramp(tmp_path_factory):
    """A 30-frame H.264 MP4 whose frame i is flat grey 8 i, with a key frame every
    4 frames and B-frames (display order differs from decoding order), so that
    reading frames seeks across key frames; and the same video with its index at
    the front (faststart), which a truncation cuts mid-stream."""
    if "libx264" not in av.codecs_available:
        pytest.skip("PyAV has no libx264 encoder")
    frames = np.repeat(np.arange(30, dtype=np.uint8)[:, None, None, None] * 8, 3, axis=3)
    frames = np.ascontiguousarray(np.broadcast_to(frames, (30, 32, 48, 3)))
    folder = tmp_path_factory.mktemp("ramp")
    options = {"g": "4", "bf": "2", "crf": "18"}
    path, front = str(folder / "ramp.mp4"), str(folder / "ramp_faststart.mp4")
    _write_h264(path, frames, options)
    _write_h264(front, frames, options, {"movflags": "faststart"})
    return path, front


@needs_torchcodec
def test_torchcodec_frames_equal_pyavs_on_moving_shapes(tiny_shapes, tmp_path):
    """Bit-for-bit equal to PyAV (tolerance 0) on every frame of the tiny built-in
    videos and of one video of the demo's size (96 x 72, 32 frames), in any index
    order, repeats and past-the-end indices included."""
    demo = MovingShapesSpec()
    demo_video = str(tmp_path / "demo_size.mp4")
    write_mp4(demo_video, render_moving_shape(np.random.default_rng(0), "up", demo), demo.fps)
    paths = [
        r["path"] for split in ("train", "val") for r in load_moving_shapes(tiny_shapes, split)
    ]
    for path in paths + [demo_video]:
        with open_video(path, "pyav") as video:
            n = video.num_frames
            indices = np.concatenate([np.arange(n)[::-1], [0, n // 2, n // 2, n + 3]])
            expected = video.read(indices)
        with open_video(path, "torchcodec") as video:
            assert video.num_frames == n
            frames = video.read(indices)
        assert frames.shape == expected.shape == (len(indices), *expected.shape[1:])
        assert frames.dtype == np.uint8 and frames.flags.c_contiguous
        np.testing.assert_array_equal(frames, expected, err_msg=path)


@needs_torchcodec
def test_torchcodec_is_frame_exact_across_key_frames(ramp):
    path, _ = ramp
    indices = np.array([29, 3, 17, 17, 0, 8, 40])
    with open_video(path, "torchcodec") as video:
        assert video.num_frames == 30
        grey = video.read(indices)[:, 0, 0, 0].astype(int)
    # frame i is grey 8 i (H.264 at crf 18: within 2 levels); index 40 is past the end.
    assert np.abs(grey - 8 * np.array([29, 3, 17, 17, 0, 8, 29])).max() <= 2
    with open_video(path, "pyav") as video:
        np.testing.assert_array_equal(video.read(indices)[:, 0, 0, 0], grey)


@needs_torchcodec
def test_torchcodec_unreadable_files_are_skipped_like_pyavs(tmp_path, ramp, caplog):
    good, front = ramp
    data = open(front, "rb").read()
    bad = {
        "random.mp4": os.urandom(2000),
        "empty.mp4": b"",
        "no_index.mp4": open(good, "rb").read()[:300],  # the index (moov) is at the end
        "cut_mid_stream.mp4": data[: int(len(data) * 0.7)],  # index first, frames cut
    }
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
    paths = [str(tmp_path / name) for name in bad] + [str(tmp_path / "missing.mp4")]
    for path in paths:
        for decoder in ("pyav", "torchcodec"):
            with pytest.raises(VideoDecodeError) as error:
                with open_video(path, decoder) as video:
                    video.read(np.arange(30))
            assert error.value.path == path and error.value.reason

    records = [{"path": p, "label": 0} for p in paths] + [{"path": good, "label": 1}]
    kw = dict(clip_shape=ClipShape(4, 16), decoder="torchcodec")
    train = VideoDataset(records, is_train=True, augmentation=TrainAugmentation(flip=False), **kw)
    sample = train[0]
    assert sample["label"] == 1 and sample["num_skipped"] == 5 and train.num_skipped == 5
    assert "random.mp4" in caplog.text and "cut_mid_stream.mp4" in caplog.text
    test = VideoDataset(records, is_train=False, test_views=TestViews(2, 1, 16, 16), **kw)
    assert test[0]["valid"] is False and test[5]["valid"] is True
    assert test[0]["clip"].shape == test[5]["clip"].shape == (2, 4, 3, 16, 16)


def test_missing_torchcodec_is_an_error_that_names_the_key_not_a_skip(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # `import torchcodec` fails
    decoding.torchcodec_unavailable.cache_clear()
    try:
        reason = torchcodec_unavailable()
    finally:
        decoding.torchcodec_unavailable.cache_clear()
    assert "not installed" in reason and "pip install torchcodec" in reason
    # Installed, but no FFmpeg library it can load (torchcodec imports all the same).
    no_ffmpeg = types.SimpleNamespace(__version__="0.17.0", ffmpeg_major_version=None)
    monkeypatch.setitem(sys.modules, "torchcodec", no_ffmpeg)
    decoding.torchcodec_unavailable.cache_clear()
    try:
        assert "FFmpeg 4-9" in torchcodec_unavailable()
    finally:
        decoding.torchcodec_unavailable.cache_clear()

    monkeypatch.setattr(decoding, "torchcodec_unavailable", lambda: reason)
    path = str(tmp_path / "any.mp4")
    for name in ("torchcodec", "torchcodec_cuda"):
        with pytest.raises(RuntimeError, match=f"INPUT.VIDEO.DECODER '{name}'") as error:
            open_video(path, name)
        assert not isinstance(error.value, VideoDecodeError)
    # The dataset does not take it for an unreadable video: the run stops.
    train = VideoDataset(
        [{"path": path, "label": 0}],
        is_train=True,
        clip_shape=ClipShape(4, 16),
        decoder="torchcodec",
    )
    with pytest.raises(RuntimeError, match="pip install torchcodec"):
        train[0]
    with pytest.raises(ValueError, match="torchcodec_cuda"):
        open_video(path, "torchcodecs")


@needs_torchcodec
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_torchcodec_cuda_without_a_gpu_is_a_clear_error(ramp):
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        open_video(ramp[0], "torchcodec_cuda")


@needs_torchcodec
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_torchcodec_cuda_reads_the_requested_frames(ramp):
    """NVDEC's frames, converted to RGB on the GPU: the same frame indices as the
    CPU's; the colour conversion may differ by a few levels."""
    indices = np.array([29, 3, 17, 0, 40])
    with open_video(ramp[0], "torchcodec") as video:
        expected = video.read(indices).astype(int)
    with open_video(ramp[0], "torchcodec_cuda") as video:
        frames = video.read(indices)
    assert frames.shape == expected.shape and frames.dtype == np.uint8
    assert np.abs(frames.astype(int) - expected).max() <= 4
