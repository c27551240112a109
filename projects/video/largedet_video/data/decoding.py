"""Reading selected frames of a video: PyAV, OpenCV, or a folder of JPEG frames.

Every reader is used the same way::

    with open_video(path, "pyav") as video:
        n = video.num_frames                  # to choose indices
        frames = video.read(indices)          # (len(indices), H, W, 3) uint8 RGB

Videos are decoded once from the start up to the last requested frame; only
requested frames are converted to RGB. Containers whose header frame count is
wrong are handled: indices past the last decodable frame get the last frame.
Any failure to read is raised as :class:`VideoDecodeError`.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import av
import cv2
import numpy as np

__all__ = ["VideoDecodeError", "open_video", "PyAVVideo", "OpenCVVideo", "FrameFolder", "DECODERS"]

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


class PyAVVideo(_Video):
    def __init__(self, path: str):
        self.path = path
        try:
            self._container = av.open(path)
            self._stream = self._container.streams.video[0]
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
                frames[i] = frame.to_ndarray(format="rgb24")
            if i >= stop:
                break
        if last >= 0 and last not in frames and stop > last:
            frames[last] = last_frame.to_ndarray(format="rgb24")
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


DECODERS = {"pyav": PyAVVideo, "opencv": OpenCVVideo}


def open_video(path: str, decoder: str = "pyav") -> _Video:
    """Open ``path`` with ``decoder`` ("pyav" or "opencv"); a directory is read
    as a :class:`FrameFolder` whatever the decoder."""
    if os.path.isdir(path):
        return FrameFolder(path)
    if decoder not in DECODERS:
        raise ValueError(f"Unknown video decoder {decoder!r}; choose from {sorted(DECODERS)}")
    return DECODERS[decoder](path)
