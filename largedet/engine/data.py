"""The training data stream, with a position that survives a resume.

Detectron2's ``TrainingSampler`` is one infinite, seeded stream of shuffled dataset
indices; rank ``r`` of ``W`` takes its entries ``r, r + W, r + 2W, ...``. Each optimizer
step consumes the next ``IMS_PER_BATCH`` entries of that global stream (every rank
takes ``IMS_PER_DEVICE x K`` of them), so after ``P`` images the data position is
simply ``P`` and the seed: :class:`ResumableTrainingSampler` restarts the stream there,
on any number of ranks. The position is exact without aspect-ratio grouping
(``DATALOADER.ASPECT_RATIO_GROUPING``), whose per-worker buckets hold a few images that
a resume skips.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterable, Iterator, Optional

from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader, get_detection_dataset_dicts
from detectron2.data.samplers import TrainingSampler
from detectron2.utils import comm

__all__ = ["ResumableLoader", "ResumableTrainingSampler", "build_train_loader"]

logger = logging.getLogger(__name__)


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


def build_train_loader(
    cfg: CfgNode, images_per_device: int, mapper: Optional[Callable] = None
) -> Iterable:
    """Detectron2's detection training loader yielding ``images_per_device`` images per batch.

    With ``DATALOADER.SAMPLER_TRAIN`` "TrainingSampler" (the default) it is a
    :class:`ResumableLoader`; other samplers give Detectron2's loader as it is, whose data
    position is not restored on resume. ``mapper`` defaults to Detectron2's
    ``DatasetMapper(cfg, is_train=True)``.
    """
    total_batch_size = images_per_device * comm.get_world_size()
    if cfg.DATALOADER.SAMPLER_TRAIN != "TrainingSampler":
        logger.warning(
            "DATALOADER.SAMPLER_TRAIN %s: the data position is not restored on resume",
            cfg.DATALOADER.SAMPLER_TRAIN,
        )
        return build_detection_train_loader(cfg, mapper=mapper, total_batch_size=total_batch_size)
    dataset = get_detection_dataset_dicts(
        cfg.DATASETS.TRAIN,
        filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        min_keypoints=(
            cfg.MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE if cfg.MODEL.KEYPOINT_ON else 0
        ),
        proposal_files=cfg.DATASETS.PROPOSAL_FILES_TRAIN if cfg.MODEL.LOAD_PROPOSALS else None,
    )
    sampler = ResumableTrainingSampler(len(dataset))
    loader = build_detection_train_loader(
        cfg, mapper=mapper, dataset=dataset, sampler=sampler, total_batch_size=total_batch_size
    )
    return ResumableLoader(loader, sampler)
