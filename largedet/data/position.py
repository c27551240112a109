"""Where a run is in its training data: the images of the global stream trained on so far.

A :class:`DataPosition` is what a checkpoint holds of the data (the seed, the position and
the layout it was trained on) and what a resume gives back to the loader
(:meth:`~largedet.data.build.ResumableLoader.seek`). The trainer advances it by each
optimizer step's global batch; a rollback of the divergence guard leaves it where it is,
so that the undone steps are not trained on the same images again.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from ..solver.batch import BatchPlan
from .build import DetectionTrainLoader, ResumableLoader

__all__ = ["DataPosition"]

logger = logging.getLogger(__name__)


class DataPosition:
    """The data position of a run on ``loader`` with the batch plan ``batch``.

    ``position`` counts images of the global stream (all ranks) trained on; ``seed`` is the
    stream's seed (None for a loader that is not a
    :class:`~largedet.data.build.ResumableLoader`, whose position cannot be restored)."""

    def __init__(self, loader, batch: BatchPlan):
        self.loader = loader
        self.batch = batch
        self.resumable = isinstance(loader, ResumableLoader)
        self.seed: Optional[int] = loader.sampler.seed if self.resumable else None
        self.position = 0

    def advance(self, images: int) -> None:
        """One optimizer step of ``images`` images (its global batch) was trained on."""
        self.position += images

    def state_dict(self) -> Dict[str, Any]:
        return {
            "seed": self.seed,
            "position": self.position,
            "world_size": self.batch.world_size,
            "per_device": self.batch.per_device,
        }

    def load_state_dict(self, data: Optional[Dict[str, Any]]) -> bool:
        """Move the loader's stream to the position ``data`` holds; returns False (with a
        warning: the stream restarts) where there is none or the loader cannot seek. The
        caller then makes a new iterator of the loader."""
        if data is None or not self.resumable:
            logger.warning("Resuming without a data position: the data stream restarts")
            return False
        self.seed, self.position = data["seed"], data["position"]
        self.loader.seek(self.position, self.seed)
        logger.info("Data stream resumes after %d images (seed %d)", self.position, self.seed)
        self._log_layout_change(data)
        return True

    def _log_layout_change(self, data: Dict[str, Any]) -> None:
        """Say so when the run resumes on another number of processes or micro-batch size
        than the checkpoint's, and what stays exact."""
        world, per_device = data.get("world_size"), data.get("per_device")
        batch = self.batch
        if world is None or (world, per_device) == (batch.world_size, batch.per_device):
            return
        regrouped = (
            self.loader.regrouped_images(world, per_device, self.position)
            if isinstance(self.loader, DetectionTrainLoader)
            else None
        )
        if regrouped is None:
            stream = "the data stream continues exactly (no image repeated or skipped)"
        elif regrouped == 0:
            stream = "aspect-ratio grouping regroups the same images (none repeated or skipped)"
        else:
            stream = (
                f"aspect-ratio grouping regroups the stream on the new layout: {regrouped} of the "
                f"{self.position} images trained on are trained again and {regrouped} not yet "
                "trained on are skipped"
            )
        logger.warning(
            "Resuming on %d process(es) x %d image(s) per pass x K = %d (the checkpoint's run: "
            "%d x %d x K = %d): the global batch %d, the LR schedule and the data position carry "
            "over; %s; the weights are not bit-exact with an uninterrupted run (gradients are "
            "summed in another order, BN sees other micro-batches)",
            batch.world_size, batch.per_device, batch.accumulation,
            world, per_device, batch.accumulation_on(world, per_device), batch.global_batch, stream,
        )  # fmt: skip
