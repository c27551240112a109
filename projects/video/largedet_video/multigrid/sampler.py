"""A batch sampler whose batches carry the multigrid shape they must be loaded at."""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import torch
from torch.utils.data import Sampler

from detectron2.utils import comm

from .schedule import ClipShape, MultigridSchedule, MultigridStage

__all__ = ["MultigridBatchSampler"]


class MultigridBatchSampler(Sampler[List[Tuple[int, ClipShape]]]):
    """Per-device batches for a :class:`MultigridSchedule`, one epoch at a time.

    Each batch is a list of ``(index, shape)`` pairs, all with the same
    :class:`ClipShape`: the dataset's ``__getitem__`` receives one pair and
    loads clip ``index`` with ``shape.num_frames`` frames and a
    ``shape.crop_size`` crop. Pass the sampler as ``batch_sampler`` to a
    ``DataLoader``; since the shape travels with the indices, one loader (and
    its workers) serves every stage: call :meth:`set_epoch` before iterating.

    Within an epoch the batches follow the current stage's short cycle, one
    iteration per shape, starting again from its first shape each epoch; a
    batch holds ``shape.batch_size`` clips (``batch_factor`` times the base
    per-device batch). The LR does not depend on the position in the cycle.
    With sub-batch BN, give the model the grouping of each batch's size:
    ``set_bn_grouping(model, bn_grouping(shape.batch_size, 8, world_size))``
    (see :mod:`largedet_video.layers.subbatch_bn`).

    Sharding follows ``torch.utils.data.DistributedSampler``: each epoch the
    indices are shuffled with ``seed + epoch`` (the same on every rank), padded
    by wrapping around to a multiple of ``world_size``, and rank ``r`` takes every
    ``world_size``-th index from ``r``. Every rank therefore yields the same
    number of batches with the same shapes, as DDP requires.

    Args:
        num_samples: size of the training set (clips).
        schedule: the multigrid schedule; shapes and per-device batch sizes come
            from its stages.
        shuffle: shuffle each epoch (otherwise dataset order).
        seed: shuffling seed, the same on all ranks; ``None`` draws a shared
            seed across ranks (as Detectron2's ``TrainingSampler``).
        rank, world_size: this process's shard; ``None`` reads them from
            ``detectron2.utils.comm``.
        drop_last: drop the epoch's last batch when it is short (a short batch
            would break the fixed sub-batch BN groups).
    """

    def __init__(
        self,
        num_samples: int,
        schedule: MultigridSchedule,
        *,
        shuffle: bool = True,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = True,
    ):
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}.")
        self.num_samples = num_samples
        self.schedule = schedule
        self.shuffle = shuffle
        self.seed = int(comm.shared_random_seed() if seed is None else seed)
        self.rank = comm.get_rank() if rank is None else rank
        self.world_size = comm.get_world_size() if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size}).")
        self.drop_last = drop_last
        self.set_epoch(0)

    @property
    def samples_per_rank(self) -> int:
        """Clips each rank sees per epoch (after padding)."""
        return -(-self.num_samples // self.world_size)

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """Select the epoch: its shuffle and its stage (shapes and batch sizes).

        ``start_iteration`` skips that many batches of the epoch, so a run
        resumed mid-epoch continues with the same clips and the same
        short-cycle position. Every later iteration over the sampler yields the
        same batches until the next call.
        """
        stage = self.schedule.stage_at(epoch)
        if not 0 <= start_iteration <= self.num_batches(stage):
            raise ValueError(
                f"start_iteration {start_iteration} is outside the epoch's "
                f"{self.num_batches(stage)} batches."
            )
        self.epoch = epoch
        self.stage = stage
        self.start_iteration = start_iteration

    def num_batches(self, stage: MultigridStage) -> int:
        """Batches per rank in one full epoch of ``stage``."""
        sizes = [shape.batch_size for shape in stage.short_cycle_shapes]
        full_cycles, left = divmod(self.samples_per_rank, sum(sizes))
        count = full_cycles * len(sizes)
        for size in sizes:
            if left < size:
                break
            left -= size
            count += 1
        if left > 0 and not self.drop_last:
            count += 1
        return count

    def total_iterations(self) -> int:
        """Iterations per rank over the whole schedule (for ETA and logging)."""
        return sum(self.num_batches(s) * s.num_epochs for s in self.schedule.stages)

    def shape_at(self, iteration: int) -> ClipShape:
        """The shape of batch ``iteration`` (0-based, within the current epoch)."""
        shapes = self.stage.short_cycle_shapes
        return shapes[iteration % len(shapes)]

    def _indices(self) -> List[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = list(range(self.num_samples))
        total = self.samples_per_rank * self.world_size
        order = (order * -(-total // self.num_samples))[:total]
        return order[self.rank : total : self.world_size]

    def __iter__(self) -> Iterator[List[Tuple[int, ClipShape]]]:
        indices = self._indices()
        start, iteration = 0, 0
        while start < len(indices):
            shape = self.shape_at(iteration)
            batch = indices[start : start + shape.batch_size]
            if len(batch) < shape.batch_size and self.drop_last:
                return
            if iteration >= self.start_iteration:
                yield [(index, shape) for index in batch]
            start += shape.batch_size
            iteration += 1

    def __len__(self) -> int:
        """Batches the next iteration yields: the current stage's epoch length,
        less ``start_iteration``."""
        return self.num_batches(self.stage) - self.start_iteration
