"""The test loader: Detectron2's, with images that cannot be read logged, counted and left
out of the evaluation instead of stopping it (:func:`build_test_loader`)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from detectron2.config import CfgNode
from detectron2.data import DatasetFromList, DatasetMapper, build_detection_test_loader, get_detection_dataset_dicts
from torch.utils.data import DataLoader, Dataset

from .unreadable import SkipUnreadable, max_consecutive_skips, max_image_pixels
from .workers import start_workers, worker_init_fn

__all__ = ["SkippingTestLoader", "build_test_loader"]

logger = logging.getLogger(__name__)


class _Mapped(Dataset):
    """``mapper(dataset[i])``, without Detectron2's ``MapDataset`` retrying a ``None`` on
    another index."""

    def __init__(self, dataset: Sequence, mapper: Callable):
        self.dataset = dataset
        self.mapper = mapper

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.mapper(self.dataset[index])


class SkippingTestLoader:
    """The batches of a test loader whose unreadable images map to ``None``, with those
    left out (a batch left empty is not yielded). :attr:`num_skipped`: the images left
    out in the current or last pass, on this rank; logged at the end of a pass."""

    def __init__(self, loader: DataLoader, dataset_name: str):
        self.loader = loader
        self.dataset_name = dataset_name
        self.num_skipped = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[List[Dict[str, Any]]]:
        self.num_skipped = 0
        for batch in start_workers(self.loader):
            kept = [x for x in batch if x is not None]
            self.num_skipped += len(batch) - len(kept)
            if kept:
                yield kept
        if self.num_skipped:
            logger.warning(
                "%s: %d unreadable images left out of the evaluation on this rank",
                self.dataset_name,
                self.num_skipped,
            )


def build_test_loader(cfg: CfgNode, dataset_name: str, mapper: Optional[Callable] = None):
    """Detectron2's test loader of ``dataset_name`` (one image per batch, split over the
    ranks by ``InferenceSampler``), as a :class:`SkippingTestLoader`: unreadable images are
    logged and left out. ``mapper`` defaults to ``DatasetMapper(cfg, is_train=False)``."""
    proposal_files = None
    if cfg.MODEL.LOAD_PROPOSALS:
        index = list(cfg.DATASETS.TEST).index(dataset_name)
        proposal_files = [cfg.DATASETS.PROPOSAL_FILES_TEST[index]]
    dataset = get_detection_dataset_dicts(
        [dataset_name], filter_empty=False, proposal_files=proposal_files
    )
    mapper = SkipUnreadable(
        DatasetMapper(cfg, is_train=False) if mapper is None else mapper,
        max_consecutive_skips(cfg),
        max_image_pixels(cfg),
    )
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    loader = build_detection_test_loader(
        _Mapped(dataset, mapper),
        mapper=None,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
    )
    loader.worker_init_fn = worker_init_fn(cfg)  # Detectron2's builder takes none
    return SkippingTestLoader(loader, dataset_name)
