"""Images that cannot be read: skipped, logged with the file and the reason, never fatal.

A large dataset has a few unreadable files: truncated JPEGs, bytes that are no image,
files deleted since the annotations were written. :class:`SkipUnreadable` wraps a
Detectron2 mapper (``DatasetMapper`` or any callable on dataset dicts) so that such an
image maps to ``None`` instead of raising, which Detectron2's loaders and largedet's
(:mod:`largedet.data.build`) read as "no sample here": training takes another image,
evaluation leaves the image out. Many unreadable images in a row stop the run with an
error naming the last one, so that a wrong dataset path fails loudly instead of
spinning. The video project does the same for videos
(``largedet_video.data.VideoDataset``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

__all__ = ["MAX_CONSECUTIVE_SKIPS", "UNREADABLE_ERRORS", "SkipUnreadable", "max_consecutive_skips"]

logger = logging.getLogger(__name__)

# What reading an image raises when the file is the problem. OSError covers a missing or
# unreadable file (FileNotFoundError, PermissionError), bytes that are no image (PIL's
# UnidentifiedImageError) and a truncated or corrupt one ("image file is truncated",
# "broken data stream"); PIL raises SyntaxError for some malformed headers and chunks.
UNREADABLE_ERRORS = (OSError, SyntaxError)

# Unreadable images in a row tolerated by default (per process), as the video project's
# DATALOADER.MAX_CONSECUTIVE_SKIPS.
MAX_CONSECUTIVE_SKIPS = 10


class SkipUnreadable:
    """``mapper`` on dataset dicts, with an unreadable image mapped to ``None``.

    Each unreadable image is logged (file and reason) and counted in :attr:`num_skipped`
    (this process's total: each DataLoader worker has its own). After
    ``max_consecutive_skips`` unreadable images in a row in this process the next one
    raises ``RuntimeError`` naming it. Errors other than :data:`UNREADABLE_ERRORS`
    (a bug in a mapper, a wrong annotation) propagate unchanged.

    Args:
        mapper: maps a Detectron2 dataset dict (with ``"file_name"``) to the model's input.
        max_consecutive_skips: unreadable images in a row tolerated, an integer >= 0.
    """

    def __init__(
        self,
        mapper: Callable[[Dict[str, Any]], Any],
        max_consecutive_skips: int = MAX_CONSECUTIVE_SKIPS,
    ):
        if max_consecutive_skips < 0:
            raise ValueError(f"max_consecutive_skips must be >= 0, got {max_consecutive_skips}")
        self.mapper = mapper
        self.max_consecutive_skips = max_consecutive_skips
        self.num_skipped = 0
        self._consecutive = 0

    def __call__(self, dataset_dict: Dict[str, Any]) -> Optional[Any]:
        file_name = dataset_dict.get("file_name", "<no file_name>")
        try:
            mapped = self.mapper(dataset_dict)
        except UNREADABLE_ERRORS as e:
            self._consecutive += 1
            if self._consecutive > self.max_consecutive_skips:
                raise RuntimeError(
                    f"{self._consecutive} unreadable images in a row (the last: {file_name}: "
                    f"{type(e).__name__}: {e}); check the dataset's paths and files"
                ) from e
            self.num_skipped += 1
            logger.warning(
                "Skipping unreadable image %s (%s: %s); %d skipped so far in this process",
                file_name,
                type(e).__name__,
                e,
                self.num_skipped,
            )
            return None
        self._consecutive = 0
        return mapped


def max_consecutive_skips(cfg) -> int:
    """``DATALOADER.MAX_CONSECUTIVE_SKIPS`` of ``cfg`` (a config without it: the default
    :data:`MAX_CONSECUTIVE_SKIPS`)."""
    return cfg.DATALOADER.get("MAX_CONSECUTIVE_SKIPS", MAX_CONSECUTIVE_SKIPS)
