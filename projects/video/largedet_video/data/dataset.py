"""``VideoDataset``: records -> decoded, sampled, cropped clips.

Training samples are ``{"clip": uint8 (T, 3, S, S), "label": int, "num_skipped": int}``;
test samples are ``{"clip": uint8 (V, T, 3, S, S), "label": int, "index": int,
"valid": bool}`` with the V = clips x crops views of one video (clip-major).

A video that cannot be read never stops training: the training sample is taken
from the next index instead (``num_skipped`` counts how many were passed over;
after ``max_consecutive_skips`` unreadable videos in a row it raises, so a wrong
dataset path fails loudly instead of spinning). At test time the video is
returned as zeros with ``valid=False`` and the evaluator leaves it out and
counts it. Either way the failure is logged with the file and the reason.

With ``decoded_cache_mb`` > 0 each video is decoded whole the first time it is read
and kept in memory (:class:`DecodedVideoCache`) until that budget is spent; later
reads of it take their frames from memory. The frames are the decoder's own, so a
cached run draws exactly the clips an uncached run draws.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .decoding import VideoDecodeError, _Video, open_video
from .sampling import ClipShape, FrameSampling
from .transforms import crop_and_resize, multi_scale_crop_box, view_crop_boxes

__all__ = ["TrainAugmentation", "TestViews", "DecodedVideoCache", "VideoDataset"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainAugmentation:
    """TSN's multi-scale crop (``scales``, ``max_distort``) and horizontal flip."""

    scales: Sequence[float] = (1.0, 0.875, 0.75, 0.66)
    max_distort: int = 1
    flip: bool = True


@dataclass(frozen=True)
class TestViews:
    """The test views of a video: ``num_clips`` clips x ``num_crops`` crops of
    ``crop_size`` pixels after resizing the short side to ``short_side``."""

    num_clips: int = 10
    num_crops: int = 3
    short_side: int = 256
    crop_size: int = 224

    @property
    def num_views(self) -> int:
        return self.num_clips * self.num_crops


class _DecodedVideo(_Video):
    """A whole decoded video in memory, read like an open one: ``num_frames`` is the
    decoder's count and an index past the decoded frames gets the last one."""

    def __init__(self, path: str, num_frames: int, frames: np.ndarray):
        self.path = path
        self._num_frames = num_frames
        self.frames = frames

    @property
    def num_frames(self) -> int:
        return self._num_frames

    def read(self, indices: np.ndarray) -> np.ndarray:
        return self.frames[np.minimum(np.asarray(indices, dtype=np.int64), len(self.frames) - 1)]


class DecodedVideoCache:
    """Whole decoded videos kept in memory, up to ``max_bytes`` of frames (in each
    process: every DataLoader worker keeps its own). A video is decoded whole on its
    first read (frames 0 to its frame count, or to the record's ``num_frames`` when
    larger); once a video no longer fits, nothing more is added and the rest are
    read from their files as without a cache. A video whose whole decoding fails
    (say, a corrupt tail the clip never reaches) is read as without a cache, then and
    on every later read, and not kept, so a cache changes no sample and no skip."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.full = False
        self._videos: Dict[str, _DecodedVideo] = {}
        self._not_whole: set = set()  # paths whose whole decoding failed: not tried again

    def __len__(self) -> int:
        return len(self._videos)

    @contextlib.contextmanager
    def open(self, record: Dict, decoder: str) -> Iterator[_Video]:
        """Like :func:`open_video` for ``record["path"]``, served from memory when it can be."""
        path = record["path"]
        cached = self._videos.get(path)
        if cached is not None:
            self.hits += 1
            yield cached
            return
        self.misses += 1
        whole = None if self.full or path in self._not_whole else self._decode_whole(record, decoder)
        if whole is None:  # the file as it is, uncached; errors surface from here
            if not self.full:
                self._not_whole.add(path)
            with open_video(path, decoder) as video:
                yield video
            return
        if self.bytes + whole.frames.nbytes <= self.max_bytes:
            self._videos[path] = whole
            self.bytes += whole.frames.nbytes
        else:
            self.full = True
            logger.info(
                "Decoded-video cache full: %d videos, %.0f MB of %.0f MB; later videos are "
                "read from their files on every read",
                len(self._videos), self.bytes / 2**20, self.max_bytes / 2**20,
            )
        yield whole

    @staticmethod
    def _decode_whole(record: Dict, decoder: str) -> Optional[_DecodedVideo]:
        try:
            with open_video(record["path"], decoder) as video:
                count = video.num_frames
                frames = video.read(np.arange(max(count, record.get("num_frames") or 0)))
        except VideoDecodeError:
            return None
        return _DecodedVideo(record["path"], count, np.ascontiguousarray(frames))


class VideoDataset(Dataset):
    def __init__(
        self,
        records: List[Dict],
        *,
        is_train: bool,
        clip_shape: ClipShape,
        sampling: FrameSampling = FrameSampling(),
        augmentation: TrainAugmentation = TrainAugmentation(),
        test_views: TestViews = TestViews(),
        decoder: str = "pyav",
        max_consecutive_skips: int = 10,
        decoded_cache_mb: int = 0,
    ):
        """
        Args:
            records: ``{"path", "label"[, "num_frames"]}`` dicts (see :mod:`.lists`).
            is_train: training samples (random clip and crop) or test views.
            clip_shape: the default (T, crop size) of training clips; T also sets
                the clip length of test views. A training sample can ask for
                another shape (see :meth:`__getitem__`).
            sampling: which frames make a clip.
            augmentation: training crop and flip.
            test_views: the test clips and crops.
            decoder: "pyav" or "opencv" (folders of frames need neither).
            max_consecutive_skips: unreadable training videos in a row tolerated.
            decoded_cache_mb: MB of whole decoded videos kept in memory in each
                process (:class:`DecodedVideoCache`); 0: none, every read decodes.
        """
        self.records = records
        self.is_train = is_train
        self.clip_shape = clip_shape
        self.sampling = sampling
        self.augmentation = augmentation
        self.test_views = test_views
        self.decoder = decoder
        self.max_consecutive_skips = max_consecutive_skips
        self.num_skipped = 0  # in this process (each DataLoader worker has its own)
        self._rng: Optional[np.random.Generator] = None
        self._rng_pid = -1
        self.cache = DecodedVideoCache(decoded_cache_mb * 2**20) if decoded_cache_mb > 0 else None

    def __len__(self) -> int:
        return len(self.records)

    def _open(self, record: Dict):
        if self.cache is None:
            return open_video(record["path"], self.decoder)
        return self.cache.open(record, self.decoder)

    def _generator(self) -> np.random.Generator:
        # One generator per process, seeded from numpy's global state, which
        # torch's DataLoader (and Detectron2's seeding) sets per worker.
        if self._rng is None or self._rng_pid != os.getpid():
            self._rng = np.random.default_rng(np.random.randint(2**31))
            self._rng_pid = os.getpid()
        return self._rng

    def __getitem__(self, key: Union[int, Tuple[int, ClipShape]]) -> Dict:
        """``key`` is an index, or ``(index, shape)`` to request a training clip
        of another shape: any object with ``num_frames`` and ``crop_size``
        (:class:`ClipShape`, or the multigrid schedule's shapes, which a
        shape-carrying batch sampler yields), or ``(index, shape, seed)`` to draw
        the clip's random numbers from ``seed``."""
        seed = None
        if isinstance(key, tuple):
            index, shape, *rest = key
            seed = rest[0] if rest else None
        else:
            index, shape = key, self.clip_shape
        if not self.is_train:
            return self._test_sample(index)
        for attempt in range(self.max_consecutive_skips + 1):
            record = self.records[index]
            try:
                sample = self._train_sample(record, shape, seed)
            except VideoDecodeError as e:
                self._log_skip(e)
                index = (index + 1) % len(self.records)
                continue
            sample["num_skipped"] = attempt
            return sample
        raise RuntimeError(
            f"{self.max_consecutive_skips + 1} unreadable videos in a row (the last: "
            f"{record['path']}); check the dataset's paths and files"
        )

    def _log_skip(self, error: VideoDecodeError) -> None:
        self.num_skipped += 1
        logger.warning(
            "Skipping unreadable video %s (%s); %d skipped so far in this process",
            error.path,
            error.reason,
            self.num_skipped,
        )

    def _train_sample(self, record: Dict, shape: ClipShape, seed: Optional[int] = None) -> Dict:
        """One training clip of ``shape``. A shape with fewer frames than the base
        clip (:attr:`clip_shape`) is resampled at a random, longer temporal stride
        (:meth:`FrameSampling.train_resampled`). The multi-scale crop box is chosen
        relative to the frame and then resized to ``shape.crop_size``, so a smaller
        crop shows the same field of view at a lower resolution: the scale jitter
        is rescaled by ``crop_size / base crop`` (multigrid's spatial resampling). ``seed``:
        the clip's own generator (a position-seeded stream), else the process's."""
        rng = self._generator() if seed is None else np.random.default_rng(seed)
        aug = self.augmentation
        with self._open(record) as video:
            n = record.get("num_frames") or video.num_frames
            indices = self.sampling.train_resampled(
                n, shape.num_frames, self.clip_shape.num_frames, rng
            )
            frames = video.read(indices)
        box = multi_scale_crop_box(
            frames.shape[1], frames.shape[2], aug.scales, aug.max_distort, rng
        )
        flip = aug.flip and bool(rng.integers(2))
        clip = crop_and_resize(frames, box, shape.crop_size, flip)
        return {"clip": torch.from_numpy(clip).permute(0, 3, 1, 2), "label": record["label"]}

    def _test_sample(self, index: int) -> Dict:
        record = self.records[index]
        views = self.test_views
        t = self.clip_shape.num_frames
        try:
            with self._open(record) as video:
                n = record.get("num_frames") or video.num_frames
                indices = self.sampling.test(n, t, views.num_clips)  # (clips, T)
                frames = video.read(indices.reshape(-1))
        except VideoDecodeError as e:
            self._log_skip(e)
            size = views.crop_size
            clip = torch.zeros(views.num_views, t, 3, size, size, dtype=torch.uint8)
            return {"clip": clip, "label": record["label"], "index": index, "valid": False}
        frames = frames.reshape(views.num_clips, t, *frames.shape[1:])
        boxes = view_crop_boxes(
            frames.shape[2], frames.shape[3], views.short_side, views.crop_size, views.num_crops
        )
        clip = np.stack([crop_and_resize(c, b, views.crop_size) for c in frames for b in boxes])
        return {
            "clip": torch.from_numpy(clip).permute(0, 1, 4, 2, 3),
            "label": record["label"],
            "index": index,
            "valid": True,
        }
