"""Data loaders for training and testing video models.

Decoding, sampling and cropping run in DataLoader worker processes
(``DATALOADER.NUM_WORKERS``), each preparing ``DATALOADER.PREFETCH_FACTOR``
batches ahead; batches reach the model as uint8 tensors (normalized on the
device). Training draws from largedet's resumable version of Detectron2's
infinite, rank-sharded ``TrainingSampler`` (the data position survives
``--resume``); testing uses Detectron2's ``InferenceSampler``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing
from typing import Dict, Iterator, List, Sequence

import cv2
import torch
from detectron2.data import DatasetCatalog
from detectron2.utils import comm
from detectron2.data.samplers import InferenceSampler
from largedet.data.build import (
    ResumableLoader,
    ResumableTrainingSampler,
    WorkerSafeDataLoader,
    end_loader_workers_at_exit,
    loader_worker_init,
)
from largedet.data.build import image_seed
from torch.utils.data import BatchSampler, DataLoader

from ..multigrid import MultigridBatchSampler, MultigridPlan, build_multigrid_plan
from .dataset import TestViews, TrainAugmentation, VideoDataset
from .sampling import ClipShape, FrameSampling

__all__ = [
    "build_video_dataset",
    "build_video_train_loader",
    "build_video_test_loader",
    "build_multigrid_train_loader",
    "VideoTrainLoader",
    "MultigridTrainLoader",
    "describe_clips",
]

logger = logging.getLogger(__name__)


def get_video_records(names) -> List[Dict]:
    records = list(itertools.chain.from_iterable(DatasetCatalog.get(n) for n in names))
    if not records:
        raise ValueError(f"Datasets {list(names)} are empty")
    return records


def build_video_dataset(cfg, names, is_train: bool) -> VideoDataset:
    """A :class:`VideoDataset` over the registered datasets ``names``, set up from cfg."""
    v = cfg.INPUT.VIDEO
    return VideoDataset(
        get_video_records(names),
        is_train=is_train,
        clip_shape=ClipShape(v.NUM_FRAMES, v.TRAIN_CROP_SIZE),
        sampling=FrameSampling(v.SAMPLING, v.DENSE_STRIDE),
        augmentation=TrainAugmentation(tuple(v.TRAIN_SCALES), v.MAX_DISTORT, v.FLIP),
        test_views=TestViews(
            v.TEST_NUM_CLIPS, v.TEST_NUM_CROPS, v.TEST_SHORT_SIDE, v.TEST_CROP_SIZE
        ),
        decoder=v.DECODER,
        max_consecutive_skips=cfg.DATALOADER.MAX_CONSECUTIVE_SKIPS,
        decoded_cache_mb=v.DECODED_CACHE_MB,
    )


def _worker_init(worker_id: int, signals: Sequence[str] = ()) -> None:
    cv2.setNumThreads(1)  # workers already run in parallel
    loader_worker_init(worker_id, signals)  # a signal to the job is the main process's


def _loader(cfg, dataset, batch_sampler) -> DataLoader:
    workers = cfg.DATALOADER.NUM_WORKERS
    extra = {}
    if workers > 0:
        end_loader_workers_at_exit()  # they ignore SIGTERM
        extra = dict(
            prefetch_factor=cfg.DATALOADER.PREFETCH_FACTOR,
            persistent_workers=True,
            timeout=cfg.DATALOADER.TIMEOUT,
        )
        # Processes started by `launch` (spawn) would spawn their workers too,
        # re-importing torch in each; fork them where the platform can.
        if "fork" in multiprocessing.get_all_start_methods():
            extra["multiprocessing_context"] = "fork"

    return WorkerSafeDataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        worker_init_fn=functools.partial(_worker_init, signals=tuple(cfg.PREEMPTION.SIGNALS)),
        pin_memory=torch.device(cfg.MODEL.DEVICE).type == "cuda",
        **extra,
    )


class VideoTrainLoader(ResumableLoader):
    """This rank's endless stream of training batches (largedet's
    :class:`~largedet.data.ResumableLoader`), counting the unreadable videos
    the workers passed over (``num_skipped``, this rank's total)."""

    def __init__(self, loader: DataLoader, sampler: ResumableTrainingSampler):
        super().__init__(loader, sampler)
        self.num_skipped = 0

    @property
    def dataset(self) -> VideoDataset:
        return self.loader.dataset

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        for batch in self.loader:
            skipped = int(batch.pop("num_skipped").sum())
            if skipped:
                self.num_skipped += skipped
                logger.warning(
                    "%d unreadable training videos replaced so far on this rank", self.num_skipped
                )
            yield batch


class MultigridTrainLoader(VideoTrainLoader):
    """This rank's multigrid training batches, epoch after epoch of the schedule.

    One ``DataLoader`` over a :class:`~largedet_video.multigrid.MultigridBatchSampler`
    serves every stage: each batch carries its shape to the dataset, so moving to the
    next epoch or stage only calls the sampler's ``set_epoch`` (no new loader, no new
    workers). The stream ends after the schedule's last epoch.

    Its position is the trainer's: largedet's ``Trainer`` counts ``SOLVER.IMS_PER_BATCH``
    per optimizer step, and :meth:`seek` turns that count back into optimizer steps,
    then (through the :class:`~largedet_video.multigrid.MultigridPlan`) into the epoch
    and the batch within it, which fixes the stage, the clips and the short-cycle
    position of a resumed run.
    """

    def __init__(self, loader: DataLoader, sampler: MultigridBatchSampler, plan: MultigridPlan):
        super().__init__(loader, sampler)
        self.plan = plan
        self.start_batch = 0  # this rank's batches already trained on

    @property
    def dataset_size(self) -> int:
        return self.sampler.num_samples

    def seek(self, position: int, seed=None) -> None:
        """Start after ``position / SOLVER.IMS_PER_BATCH`` optimizer steps, with the
        shuffling ``seed`` (default: the current one)."""
        steps, rest = divmod(position, self.plan.global_batch)
        if rest or position < 0:
            raise ValueError(
                f"Data position {position} is not a whole number of steps of "
                f"{self.plan.global_batch} clips."
            )
        self.plan.locate(steps * self.plan.accumulation)  # raises past the end
        self.start_batch = steps * self.plan.accumulation
        if seed is not None:
            self.sampler.seed = int(seed)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        epoch, start = self.plan.locate(self.start_batch)
        while epoch < self.plan.schedule.max_epoch:
            self.sampler.set_epoch(epoch, start)
            yield from super().__iter__()
            epoch, start = epoch + 1, 0


def describe_clips(cfg) -> str:
    v = cfg.INPUT.VIDEO
    return (
        f"Clips: {v.NUM_FRAMES} frames ({v.SAMPLING} sampling), {v.TRAIN_CROP_SIZE}px training "
        f"crops; test {v.TEST_NUM_CLIPS} clips x {v.TEST_NUM_CROPS} crops of {v.TEST_CROP_SIZE}px "
        f"(short side {v.TEST_SHORT_SIDE}); decoder {v.DECODER}, "
        f"{cfg.DATALOADER.NUM_WORKERS} loader worker(s) per process"
    )


def build_video_train_loader(cfg, clips_per_device: int) -> VideoTrainLoader:
    """This rank's training batches of ``clips_per_device`` clips (the
    micro-batch of largedet's batch plan: ``SOLVER.IMS_PER_BATCH`` / world size
    unless ``SOLVER.IMS_PER_DEVICE`` asks for gradient accumulation)."""
    dataset = build_video_dataset(cfg, cfg.DATASETS.TRAIN, is_train=True)
    sampler = ResumableTrainingSampler(len(dataset))
    if cfg.RESEED_EVERY_ITER:
        batch_sampler = PositionSeededBatches(sampler, clips_per_device, dataset.clip_shape)
    else:
        batch_sampler = BatchSampler(sampler, clips_per_device, drop_last=True)
    logger.info("%s; %d training videos", describe_clips(cfg), len(dataset))
    return VideoTrainLoader(_loader(cfg, dataset, batch_sampler), sampler)


class PositionSeededBatches:
    """Batches of ``clips_per_device`` dataset keys ``(index, shape, seed)`` from the
    sampler's position on, each clip's augmentation seeded from (the data seed, its
    position in the global stream) (:func:`largedet.data.build.image_seed`): a resumed
    run crops and flips as an uninterrupted one did, whatever the workers
    (``RESEED_EVERY_ITER``)."""

    def __init__(self, sampler: ResumableTrainingSampler, clips_per_device: int, shape: ClipShape):
        self.sampler, self.clips_per_device, self.shape = sampler, clips_per_device, shape

    def __iter__(self):
        entries = self.sampler.entries()
        while True:
            chunk = list(itertools.islice(entries, self.clips_per_device))
            yield [(index, self.shape, image_seed(self.sampler.seed, position)) for position, index in chunk]


def build_multigrid_train_loader(cfg) -> MultigridTrainLoader:
    """This rank's multigrid training batches (``MULTIGRID.*``): shapes, per-device batch
    sizes and epochs of :func:`~largedet_video.multigrid.build_multigrid_plan`."""
    dataset = build_video_dataset(cfg, cfg.DATASETS.TRAIN, is_train=True)
    plan = build_multigrid_plan(cfg, len(dataset), comm.get_world_size())
    sampler = MultigridBatchSampler(len(dataset), plan.schedule)
    logger.info("%s; %d training videos; multigrid shapes", describe_clips(cfg), len(dataset))
    return MultigridTrainLoader(_loader(cfg, dataset, sampler), sampler, plan)


def build_video_test_loader(cfg, dataset_name: str) -> DataLoader:
    """Batches of ``TEST.VIDEOS_PER_BATCH`` videos, each with all its test views;
    the dataset is split over the ranks."""
    dataset = build_video_dataset(cfg, [dataset_name], is_train=False)
    batch_sampler = BatchSampler(
        InferenceSampler(len(dataset)), cfg.TEST.VIDEOS_PER_BATCH, drop_last=False
    )
    return _loader(cfg, dataset, batch_sampler)
