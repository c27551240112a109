"""The training data stream, with a position that survives a resume, and images that
cannot be read left out instead of stopping the run.

Detectron2's ``TrainingSampler`` is one infinite, seeded stream of shuffled dataset
indices; rank ``r`` of ``W`` takes its entries ``r, r + W, r + 2W, ...``. Each optimizer
step consumes ``IMS_PER_BATCH`` images of that global stream (every rank takes
``IMS_PER_DEVICE x K`` of them), so after ``P`` images the data position is ``P`` and
the seed. :class:`TrainBatches` makes this rank's batches a function of those two
numbers alone, whatever the number of loader workers:

- without aspect-ratio grouping a batch is ``IMS_PER_DEVICE`` consecutive entries of
  this rank, and a resumed stream starts at entry ``P`` (on any number of ranks);
- with ``DATALOADER.ASPECT_RATIO_GROUPING`` the entries are grouped as Detectron2 groups
  them (two buckets, width > height or not, a batch leaving a bucket when it is full),
  but on the indices, with the width and height stored in the dataset dicts, before any
  image is read. A resumed stream replays the grouping from the stream's start and
  drops the batches already trained on, which rebuilds the buckets exactly (same
  world size and ``IMS_PER_DEVICE`` as the interrupted run);
- with ``RESEED_EVERY_ITER`` each image is mapped (read, augmented) with Python's,
  NumPy's and torch's generators seeded from the data seed and the image's position in
  the global stream, so its augmentation does not depend on which worker maps it or on
  what that worker mapped before.

An image that cannot be read (:class:`~largedet.data.unreadable.SkipUnreadable`) is
logged with the file and the reason; in training the next image of its aspect-ratio
group takes its place (the stream position stays the same) and it is counted in
``data/skipped_images`` (:class:`largedet.engine.hooks.SkippedImagesHook`); in evaluation
(:func:`build_test_loader`) it is left out and counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import (
    DatasetFromList,
    DatasetMapper,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.data.build import filter_images_with_only_crowd_annotations, trivial_batch_collator
from detectron2.data.samplers import TrainingSampler
from detectron2.utils import comm
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .coco_json import drop_unusable_boxes
from .unreadable import SkipUnreadable, max_consecutive_skips, max_image_pixels
from .test_loader import SkippingTestLoader, build_test_loader
from .workers import (
    JOB_SIGNALS,
    WorkerSafeDataLoader,
    end_loader_workers_at_exit,
    ignore_job_signals,
    loader_worker_init,
    worker_init_fn,
)

__all__ = [
    "DetectionTrainLoader",
    "ResumableLoader",
    "ResumableTrainingSampler",
    "SkippingTestLoader",
    "TrainBatches",
    "aspect_ratio_groups",
    "build_test_loader",
    "build_train_loader",
    "end_loader_workers_at_exit",
    "group_by_aspect_ratio",
    "JOB_SIGNALS",
    "ignore_job_signals",
    "image_seed",
    "loader_worker_init",
]

logger = logging.getLogger(__name__)

Entry = Tuple[int, int]  # (position in the global stream, dataset index)

class ResumableTrainingSampler(TrainingSampler):
    """Detectron2's ``TrainingSampler``, started ``position`` entries into the global stream.

    Args:
        size, shuffle, seed: as ``TrainingSampler`` (``seed`` None: a random seed shared
            by all ranks, drawn as Detectron2 draws it).
        position: entries of the global index stream (all ranks together) to skip, i.e.
            images already trained on.
    """

    def __init__(
        self, size: int, shuffle: bool = True, seed: Optional[int] = None, position: int = 0
    ):
        super().__init__(size, shuffle=shuffle, seed=seed)
        self.seek(position)

    @property
    def size(self) -> int:
        return self._size

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def position(self) -> int:
        return self._position

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def seek(self, position: int, seed: Optional[int] = None) -> None:
        """Start the next iteration ``position`` entries into the stream of ``seed``
        (default: the current seed). Iterators already created are not affected."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self._position = int(position)
        if seed is not None:
            self._seed = int(seed)

    def __iter__(self) -> Iterator[int]:
        start = self._position + self._rank
        yield from itertools.islice(self._infinite_indices(), start, None, self._world_size)

    def global_entries(self) -> Iterator[Entry]:
        """Every rank's ``(global position, dataset index)`` pairs from the stream's start."""
        return zip(itertools.count(), self._infinite_indices())

    def entries(self, start: Optional[int] = None) -> Iterator[Entry]:
        """This rank's ``(global position, dataset index)`` pairs from the global position
        ``start`` on (default: :attr:`position`)."""
        first = (self._position if start is None else start) + self._rank
        indices = itertools.islice(self._infinite_indices(), first, None, self._world_size)
        return zip(itertools.count(first, self._world_size), indices)


class ResumableLoader:
    """This rank's infinite stream of training batches whose start can be moved.

    Iterating it iterates ``loader`` (Detectron2's training loader over ``sampler``);
    :meth:`seek` moves the start of the iterators created afterwards.
    """

    def __init__(self, loader: Iterable, sampler: ResumableTrainingSampler):
        self.loader = loader
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    @property
    def dataset_size(self) -> int:
        return self.sampler.size

    def seek(self, position: int, seed: Optional[int] = None) -> None:
        self.sampler.seek(position, seed)


def image_seed(seed: int, position: int) -> int:
    """The seed, in [0, 2**31), of the image at ``position`` of the global stream of
    ``seed``: NumPy's ``SeedSequence`` of the two (the per-step seeds of
    :func:`~largedet.engine.hooks.step_seed` hash three numbers, so the two never meet)."""
    return int(np.random.SeedSequence([seed, position]).generate_state(1)[0] % 2**31)


@contextlib.contextmanager
def _seeded(seed: int):
    """Python's, NumPy's and torch's CPU generators seeded with ``seed`` inside the block,
    and back to their earlier states after it."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def aspect_ratio_groups(dataset_dicts: Sequence[Dict[str, Any]]) -> np.ndarray:
    """Detectron2's two aspect-ratio groups of each dataset dict, from its ``"width"``
    and ``"height"`` (no image is read): (N,) uint8, 0 where width > height, else 1.

    A dataset with an ``image_sizes`` array of (N, 2) (height, width), as
    :class:`~largedet.data.OpenImagesDataset`, is read from that array instead of its dicts.
    """
    sizes = getattr(dataset_dicts, "image_sizes", None)
    if sizes is not None:
        sizes = np.asarray(sizes)
        return np.where(sizes[:, 1] > sizes[:, 0], 0, 1).astype(np.uint8)
    groups = np.empty(len(dataset_dicts), dtype=np.uint8)
    for i in range(len(dataset_dicts)):
        d = dataset_dicts[i]
        if "width" not in d or "height" not in d:
            raise ValueError(
                "DATALOADER.ASPECT_RATIO_GROUPING needs 'width' and 'height' in every dataset "
                f"dict; {d.get('file_name', f'dict {i}')} has none"
            )
        groups[i] = 0 if d["width"] > d["height"] else 1
    return groups


def group_by_aspect_ratio(
    entries: Iterable[Entry], batch_size: int, groups: np.ndarray
) -> Iterator[List[Entry]]:
    """Detectron2's ``AspectRatioGroupedDataset`` on ``(position, index)`` entries: each
    goes to the bucket of ``groups[index]``, and a bucket that holds ``batch_size``
    entries is emitted (in stream order) and emptied."""
    buckets: Tuple[List[Entry], List[Entry]] = ([], [])
    for entry in entries:
        bucket = buckets[groups[entry[1]]]
        bucket.append(entry)
        if len(bucket) == batch_size:
            yield bucket[:]
            bucket.clear()


def _batched(entries: Iterable[Entry], batch_size: int) -> Iterator[List[Entry]]:
    it = iter(entries)
    return iter(lambda: list(itertools.islice(it, batch_size)), [])


class TrainBatches(IterableDataset):
    """This rank's endless stream of mapped training batches, a function of the data seed
    (``sampler.seed``) and the data position (``sampler.position``, images of the global
    stream trained on) only.

    This rank's entries of the global stream (:meth:`ResumableTrainingSampler.entries`)
    are cut into batches of ``batch_size``: consecutive entries from the position on, or,
    with ``groups`` (:func:`aspect_ratio_groups`), the batches of
    :func:`group_by_aspect_ratio` over the entries from the stream's start, less the
    first ``position / (world size x batch_size)`` of them (replayed without reading an
    image). Under a DataLoader with N workers, worker w maps batches w, w + N, ..., which
    the DataLoader returns in order.

    Each entry's image is ``mapper(dataset[index])``. ``None`` (an unreadable image, see
    :class:`~largedet.data.unreadable.SkipUnreadable`) passes it over for the next index
    of the same aspect-ratio group (the next index without ``groups``); the mapped dict's
    ``"num_skipped"`` says how many were passed over. With ``seed_per_image`` the mapping
    runs under :func:`image_seed` (data seed, position); otherwise under the process's
    generators, as in Detectron2.

    Args:
        dataset: the dataset dicts (a sequence, e.g. Detectron2's ``DatasetFromList``).
        mapper: dict -> the model's input, or ``None`` for an image to pass over.
        sampler: the shuffled global stream and the position.
        batch_size: images per batch (per device per pass).
        groups: :func:`aspect_ratio_groups` of ``dataset``, or None (no grouping).
        seed_per_image: seed each image's mapping from its position.
    """

    def __init__(
        self,
        dataset: Sequence[Dict[str, Any]],
        mapper: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
        sampler: ResumableTrainingSampler,
        batch_size: int,
        *,
        groups: Optional[np.ndarray] = None,
        seed_per_image: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if groups is not None and len(groups) != len(dataset):
            raise ValueError(f"{len(groups)} aspect-ratio groups for {len(dataset)} images")
        self.dataset = dataset
        self.mapper = mapper
        self.sampler = sampler
        self.batch_size = batch_size
        self.groups = groups
        self.seed_per_image = seed_per_image

    def index_batches(self) -> Iterator[List[Entry]]:
        """This rank's batches of ``(position, index)`` entries after ``sampler.position``
        images, before mapping."""
        sampler = self.sampler
        if self.groups is None:
            return _batched(sampler.entries(), self.batch_size)
        per_pass = sampler.world_size * self.batch_size
        done, rest = divmod(sampler.position, per_pass)
        if rest:
            raise ValueError(
                f"With aspect-ratio grouping the data position ({sampler.position} images) must "
                f"be a whole number of passes of {sampler.world_size} x {self.batch_size} images"
            )
        batches = group_by_aspect_ratio(sampler.entries(0), self.batch_size, self.groups)
        return itertools.islice(batches, done, None)

    def __iter__(self) -> Iterator[List[Dict[str, Any]]]:
        batches = self.index_batches()
        worker = get_worker_info()
        if worker is not None:
            batches = itertools.islice(batches, worker.id, None, worker.num_workers)
        for batch in batches:
            yield [self._map(position, index) for position, index in batch]

    def _map(self, position: int, index: int) -> Dict[str, Any]:
        seed = image_seed(self.sampler.seed, position) if self.seed_per_image else None
        for attempt in range(len(self.dataset)):
            with _seeded(seed) if seed is not None else contextlib.nullcontext():
                mapped = self.mapper(self.dataset[index])
            if mapped is not None:
                mapped["num_skipped"] = attempt
                return mapped
            index = self._next_index(index)
        raise RuntimeError(f"No image of the dataset could be mapped (stream position {position})")

    def _next_index(self, index: int) -> int:
        n = len(self.dataset)
        nxt = (index + 1) % n
        if self.groups is not None:
            while self.groups[nxt] != self.groups[index] and nxt != index:
                nxt = (nxt + 1) % n
        return nxt


def grouped_positions(
    sampler: ResumableTrainingSampler, groups: np.ndarray, world_size: int, batch_size: int, position: int
) -> set:
    """The stream positions that the first ``position`` images of a run on ``world_size``
    processes of ``batch_size`` images per pass trained on, with aspect-ratio grouping: the
    first ``position / (world_size x batch_size)`` grouped batches of every rank (replayed
    without reading an image)."""
    done = position // (world_size * batch_size)
    trained = set()
    for rank in range(world_size):
        entries = itertools.islice(sampler.global_entries(), rank, None, world_size)
        for batch in itertools.islice(group_by_aspect_ratio(entries, batch_size, groups), done):
            trained.update(p for p, _ in batch)
    return trained


class DetectionTrainLoader(ResumableLoader):
    """A :class:`ResumableLoader` over :class:`TrainBatches` that counts the unreadable
    images replaced (:attr:`num_skipped`, this rank's total since the process started)
    and logs the count when it grows."""

    def __init__(self, loader: DataLoader, sampler: ResumableTrainingSampler):
        super().__init__(loader, sampler)
        self.num_skipped = 0

    def regrouped_images(self, world_size: int, batch_size: int, position: int) -> Optional[int]:
        """With aspect-ratio grouping, resuming at ``position`` a run made on ``world_size``
        processes of ``batch_size`` images per pass on this run's layout: how many images
        of the first ``position`` the new layout counts as trained although the old run
        did not, which it therefore skips; as many of the old run's are trained again.
        None without grouping (the stream then continues exactly)."""
        batches = getattr(self.loader, "dataset", None)
        groups = getattr(batches, "groups", None)
        if groups is None:
            return None
        old = grouped_positions(self.sampler, groups, world_size, batch_size, position)
        new = grouped_positions(
            self.sampler, groups, self.sampler.world_size, batches.batch_size, position
        )
        return len(new - old)

    def __iter__(self) -> Iterator[List[Dict[str, Any]]]:
        # The DataLoader's iterator is made here, not at the first batch: making it draws
        # the workers' base seed from torch's generator (see Trainer.before_train).
        return self._count_skipped(iter(self.loader))

    def _count_skipped(self, batches: Iterator) -> Iterator[List[Dict[str, Any]]]:
        for batch in batches:
            skipped = sum(d.pop("num_skipped", 0) for d in batch)
            if skipped:
                self.num_skipped += skipped
                logger.warning(
                    "%d unreadable training images replaced so far on this rank", self.num_skipped
                )
            yield batch


def _training_dicts(cfg: CfgNode):
    """The dataset dicts of ``DATASETS.TRAIN`` as Detectron2's loader reads them, less the
    boxes of negative width or height, of zero area or wholly outside their image, and the
    boxes partly outside it clipped to it
    (:func:`~largedet.data.coco_json.drop_unusable_boxes`, each kind counted in the log; with
    ``DATALOADER.FILTER_EMPTY_ANNOTATIONS`` an image left without a box is left out too)."""
    names = cfg.DATASETS.TRAIN
    dataset = get_detection_dataset_dicts(
        names,
        filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        min_keypoints=(
            cfg.MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE if cfg.MODEL.KEYPOINT_ON else 0
        ),
        proposal_files=cfg.DATASETS.PROPOSAL_FILES_TRAIN if cfg.MODEL.LOAD_PROPOSALS else None,
    )
    if not isinstance(dataset, list):  # e.g. an OpenImagesDataset, whose boxes are checked as parsed
        return dataset
    dropped = drop_unusable_boxes(dataset)
    for count, what in ((dropped.negative, "of negative width or height left out of training"),
                        (dropped.zero_area, "of zero area left out of training"),
                        (dropped.outside, "wholly outside their image left out of training"),
                        (dropped.clipped, "partly outside their image clipped to it")):  # fmt: skip
        if count:
            logger.warning("%s: %d box(es) %s", ", ".join(names), count, what)
    if (dropped.negative or dropped.zero_area or dropped.outside) and cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS:
        dataset = filter_images_with_only_crowd_annotations(dataset)
    return dataset


def build_train_loader(
    cfg: CfgNode, images_per_device: int, mapper: Optional[Callable] = None
) -> Iterable:
    """Detectron2's detection training loader yielding ``images_per_device`` images per
    batch, with unreadable images passed over.

    With ``DATALOADER.SAMPLER_TRAIN`` "TrainingSampler" (the default) it is a
    :class:`DetectionTrainLoader` over :class:`TrainBatches`
    (``DATALOADER.ASPECT_RATIO_GROUPING``, ``DATALOADER.NUM_WORKERS``, images seeded by
    position with ``RESEED_EVERY_ITER``). Other samplers give Detectron2's loader, whose
    data position is not restored on resume and which replaces an unreadable image by a
    random other one (logged, not counted in ``data/skipped_images``). ``mapper`` defaults
    to Detectron2's
    ``DatasetMapper(cfg, is_train=True)``.
    """
    mapper = SkipUnreadable(
        DatasetMapper(cfg, is_train=True) if mapper is None else mapper,
        max_consecutive_skips(cfg),
        max_image_pixels(cfg),
    )
    dataset = _training_dicts(cfg)
    if cfg.DATALOADER.SAMPLER_TRAIN != "TrainingSampler":
        logger.warning(
            "DATALOADER.SAMPLER_TRAIN %s: the data position is not restored on resume",
            cfg.DATALOADER.SAMPLER_TRAIN,
        )
        return build_detection_train_loader(
            cfg,
            dataset=dataset,
            mapper=mapper,
            total_batch_size=images_per_device * comm.get_world_size(),
        )
    groups = aspect_ratio_groups(dataset) if cfg.DATALOADER.ASPECT_RATIO_GROUPING else None
    sampler = ResumableTrainingSampler(len(dataset))
    batches = TrainBatches(
        DatasetFromList(dataset, copy=False) if isinstance(dataset, list) else dataset,
        mapper,
        sampler,
        images_per_device,
        groups=groups,
        seed_per_image=cfg.RESEED_EVERY_ITER,
    )
    logger.info(
        "Training data: %d images, batches of %d per device%s; %d loader worker(s); "
        "augmentation seeded %s",
        len(dataset),
        images_per_device,
        " grouped by aspect ratio" if groups is not None else "",
        cfg.DATALOADER.NUM_WORKERS,
        "per image from (data seed, position)" if cfg.RESEED_EVERY_ITER else "per worker",
    )
    loader = WorkerSafeDataLoader(
        batches,
        batch_size=None,  # TrainBatches yields whole batches
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        collate_fn=trivial_batch_collator,
        worker_init_fn=worker_init_fn(cfg),
    )
    return DetectionTrainLoader(loader, sampler)
