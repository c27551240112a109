"""Reading selected frames of a video: PyAV, OpenCV, torchcodec, or a folder of JPEG frames.

Every reader is used the same way::

    with open_video(path, "pyav") as video:
        n = video.num_frames                  # to choose indices
        frames = video.read(indices)          # (len(indices), H, W, 3) uint8 RGB

The contract, the same for every decoder: ``read`` returns frame ``i`` of the
stream for index ``i`` (frame-exact, counted from 0 in display order), in the
order asked, repeats included; indices past the last decodable frame get the
last frame (containers whose header frame count is wrong); any failure to read
raises :class:`VideoDecodeError`, which the dataset skips and counts. A decoder
that is not installed raises a ``RuntimeError`` instead, which stops the run.

PyAV and OpenCV decode once from the start up to the last requested frame and
convert only the requested frames to RGB. torchcodec scans the packets once at
open (its "exact" seek mode, which makes seeking frame-exact), then decodes
forward, seeking to the last key frame before a requested frame when that skips
decoding; it runs on the CPU (``"torchcodec"``) or on the GPU's video decoder,
NVDEC (``"torchcodec_cuda"``).
"""

from __future__ import annotations

import functools
import os
import re
import threading
from typing import Dict, List, Optional

import av
import cv2
import numpy as np
import torch
from av.video.reformatter import VideoReformatter

__all__ = [
    "VideoDecodeError",
    "open_video",
    "PyAVVideo",
    "OpenCVVideo",
    "TorchCodecVideo",
    "TorchCodecCUDAVideo",
    "FrameFolder",
    "DECODERS",
    "torchcodec_unavailable",
]

_IMAGE_EXTS = (".jpg", ".jpeg", ".png")


class VideoDecodeError(RuntimeError):
    """A video (or frame folder) that cannot be read."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class _Video:
    path: str

    @property
    def num_frames(self) -> int:
        raise NotImplementedError

    def read(self, indices: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _gather(self, frames: Dict[int, np.ndarray], indices: np.ndarray, last: int) -> np.ndarray:
        if not frames:
            raise VideoDecodeError(self.path, "no frame could be decoded")
        return np.stack([frames[min(int(i), last)] for i in indices])


#: this thread's converter to RGB and the process it was made in (:func:`_rgb_reformatter`)
_RGB = threading.local()


def _rgb_reformatter() -> VideoReformatter:
    """This thread's converter to RGB: one swscale context, reused (a context is not to be
    shared between threads), and a new one in a forked child (:func:`_fork_safe_rgb`)."""
    if getattr(_RGB, "pid", None) != os.getpid():
        _RGB.pid, _RGB.reformatter = os.getpid(), VideoReformatter()
    return _RGB.reformatter


def _fork_safe_rgb(frame) -> np.ndarray:
    """``frame`` as (H, W, 3) uint8 RGB, safe in a forked loader worker.

    PyAV's own ``to_ndarray(format=...)`` converts with one swscale context per thread, kept
    for the thread's life, whose default is FFmpeg's automatic slice threads. A loader worker
    forked after the main process converted a frame inherits that context without its
    threads, and its first conversion waits for them for ever (the ``DataLoader timed out``
    of a worker that never returns a batch). One thread, in a context of this process's
    own, has no threads to lose."""
    return _rgb_reformatter().reformat(frame, format="rgb24", threads=1).to_ndarray()


class PyAVVideo(_Video):
    """PyAV, one FFmpeg thread: loader workers decode in parallel already, and a decoder
    with FFmpeg's slice threads, inherited by a forked worker without them, would wait for
    them for ever when the worker frees it (as :func:`_fork_safe_rgb` says of swscale)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._container = av.open(path)
            self._stream = self._container.streams.video[0]
            self._stream.codec_context.thread_count = 1
        except (av.FFmpegError, OSError, IndexError, ValueError) as e:
            raise VideoDecodeError(path, f"cannot open ({e})") from e
        self._num_frames: Optional[int] = self._stream.frames or None

    @property
    def num_frames(self) -> int:
        if self._num_frames is None:
            # No count in the header: count by decoding (rare; MP4 has it).
            count = sum(1 for _ in self._decode())
            self._container.seek(0)
            if count == 0:
                raise VideoDecodeError(self.path, "no frame could be decoded")
            self._num_frames = count
        return self._num_frames

    def _decode(self):
        try:
            yield from self._container.decode(self._stream)
        except (av.FFmpegError, OSError, ValueError) as e:
            raise VideoDecodeError(self.path, f"decoding failed ({e})") from e

    def read(self, indices: np.ndarray) -> np.ndarray:
        wanted = set(int(i) for i in indices)
        stop = max(wanted)
        frames: Dict[int, np.ndarray] = {}
        last, last_frame = -1, None
        for i, frame in enumerate(self._decode()):
            last, last_frame = i, frame
            if i in wanted:
                frames[i] = _fork_safe_rgb(frame)
            if i >= stop:
                break
        if last >= 0 and last not in frames and stop > last:
            frames[last] = _fork_safe_rgb(last_frame)
        return self._gather(frames, indices, last)

    def close(self) -> None:
        self._container.close()


class OpenCVVideo(_Video):
    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise VideoDecodeError(path, "no such file")
        self._cap = cv2.VideoCapture(path)
        if not self._cap.isOpened():
            raise VideoDecodeError(path, "OpenCV cannot open it")
        self._num_frames = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        if self._num_frames <= 0:
            raise VideoDecodeError(path, "OpenCV reports no frames")

    @property
    def num_frames(self) -> int:
        return self._num_frames

    def read(self, indices: np.ndarray) -> np.ndarray:
        wanted = set(int(i) for i in indices)
        stop = max(wanted)
        frames: Dict[int, np.ndarray] = {}
        last = -1
        for i in range(stop + 1):
            if not self._cap.grab():
                break
            last = i
            if i in wanted:
                ok, bgr = self._cap.retrieve()
                if not ok:
                    raise VideoDecodeError(self.path, f"cannot decode frame {i}")
                frames[i] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        if last >= 0 and last not in frames:
            # The container held fewer frames than it claimed: decode again to
            # the real last frame (rare).
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, last)
            ok, bgr = self._cap.read()
            if ok:
                frames[last] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        return self._gather(frames, indices, last)

    def close(self) -> None:
        self._cap.release()


@functools.lru_cache(maxsize=None)
def torchcodec_unavailable() -> Optional[str]:
    """None when torchcodec can decode videos here, else why not, in one line.

    torchcodec imports without FFmpeg (its image decoders need none) and loads
    its FFmpeg-dependent library at import, trying FFmpeg 9 down to 4; its
    ``ffmpeg_major_version`` is None when none loaded."""
    try:
        import torchcodec
    except ImportError as e:
        return f"torchcodec is not installed ({e}); pip install torchcodec"
    except (OSError, RuntimeError) as e:
        return f"torchcodec cannot be imported ({str(e).splitlines()[0]})"
    if torchcodec.ffmpeg_major_version is None:
        return (
            f"torchcodec {getattr(torchcodec, '__version__', '?')} cannot load its FFmpeg "
            "library: FFmpeg 4-9's shared libraries are missing (apt-get install ffmpeg) or "
            f"this torchcodec was built for another torch than {torch.__version__}"
        )
    return None


def _torchcodec_message(error: Exception) -> str:
    # torchcodec's C++ errors start with the function and source location:
    # "SingleStreamDecoder, .../SingleStreamDecoder.cpp:41, Could not open input file: ..."
    line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^.*?\.cpp:\d+, ", "", line)


class TorchCodecVideo(_Video):
    """torchcodec's ``VideoDecoder`` on the CPU, one FFmpeg thread (loader
    workers already decode in parallel), frames in the (N, H, W, 3) layout."""

    name = "torchcodec"
    device = "cpu"

    def __init__(self, path: str):
        self.path = path
        reason = torchcodec_unavailable()
        if reason is not None:
            raise RuntimeError(f"INPUT.VIDEO.DECODER {self.name!r}: {reason}")
        self._check_device()
        if not os.path.isfile(path):
            raise VideoDecodeError(path, "no such file")
        from torchcodec.decoders import VideoDecoder

        try:
            self._decoder = VideoDecoder(
                path,
                dimension_order="NHWC",
                num_ffmpeg_threads=1,
                device=self.device,
                seek_mode="exact",
            )
            self._num_frames = self._decoder.metadata.num_frames or 0
        except (RuntimeError, ValueError) as e:
            raise VideoDecodeError(path, f"cannot open ({_torchcodec_message(e)})") from e
        if self._num_frames <= 0:
            raise VideoDecodeError(path, "no frame could be decoded")

    def _check_device(self) -> None:
        pass

    @property
    def num_frames(self) -> int:
        # Counted from the packets by the scan: exact, whatever the header says.
        return self._num_frames

    def read(self, indices: np.ndarray) -> np.ndarray:
        clipped = np.minimum(np.asarray(indices, dtype=np.int64), self._num_frames - 1)
        wanted = np.unique(clipped)  # sorted: one pass forward through the stream
        try:
            batch = self._decoder.get_frames_at(wanted.tolist()).data
        except (RuntimeError, ValueError, IndexError) as e:
            raise VideoDecodeError(self.path, f"decoding failed ({_torchcodec_message(e)})") from e
        frames = batch.cpu().numpy()
        return frames[np.searchsorted(wanted, clipped)]


class TorchCodecCUDAVideo(TorchCodecVideo):
    """torchcodec decoding on the current CUDA device (NVDEC; torchcodec falls
    back to the CPU for a codec NVDEC lacks). Frames are copied back to the
    host, as the contract asks: what this saves is the loader's CPU time. CUDA
    cannot start in a DataLoader worker forked from a process that already uses
    it, so this decoder needs ``DATALOADER.NUM_WORKERS 0``."""

    name = "torchcodec_cuda"
    device = "cuda"

    def _check_device(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "INPUT.VIDEO.DECODER 'torchcodec_cuda' needs a CUDA GPU; 'torchcodec' "
                "decodes on the CPU"
            )
        if torch.cuda._is_in_bad_fork():
            raise RuntimeError(
                "INPUT.VIDEO.DECODER 'torchcodec_cuda' cannot run in a DataLoader worker "
                "forked after CUDA was initialized; set DATALOADER.NUM_WORKERS 0"
            )


class FrameFolder(_Video):
    """A folder of pre-extracted frames (``*.jpg``/``*.jpeg``/``*.png``), in the
    order of their sorted file names."""

    def __init__(self, path: str):
        self.path = path
        try:
            names = sorted(n for n in os.listdir(path) if n.lower().endswith(_IMAGE_EXTS))
        except OSError as e:
            raise VideoDecodeError(path, f"cannot list frames ({e})") from e
        if not names:
            raise VideoDecodeError(path, "no image files in the folder")
        self._files: List[str] = [os.path.join(path, n) for n in names]

    @property
    def num_frames(self) -> int:
        return len(self._files)

    def read(self, indices: np.ndarray) -> np.ndarray:
        frames: Dict[int, np.ndarray] = {}
        for i in set(int(i) for i in indices):
            bgr = cv2.imread(self._files[i], cv2.IMREAD_COLOR)
            if bgr is None:
                raise VideoDecodeError(self.path, f"cannot read {self._files[i]}")
            frames[i] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        return self._gather(frames, indices, len(self._files) - 1)


DECODERS = {
    "pyav": PyAVVideo,
    "opencv": OpenCVVideo,
    "torchcodec": TorchCodecVideo,
    "torchcodec_cuda": TorchCodecCUDAVideo,
}


def open_video(path: str, decoder: str = "pyav") -> _Video:
    """Open ``path`` with ``decoder`` (a name in :data:`DECODERS`); a directory is
    read as a :class:`FrameFolder` whatever the decoder."""
    if os.path.isdir(path):
        return FrameFolder(path)
    if decoder not in DECODERS:
        raise ValueError(f"Unknown video decoder {decoder!r}; choose from {sorted(DECODERS)}")
    return DECODERS[decoder](path)
