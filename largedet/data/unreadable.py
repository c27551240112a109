"""Images that cannot be read: skipped, logged with the file and the reason, never fatal.

A large dataset has a few unreadable files: truncated JPEGs, bytes that are no image,
files deleted since the annotations were written. :class:`SkipUnreadable` wraps a
Detectron2 mapper (``DatasetMapper`` or any callable on dataset dicts) so that such an
image maps to ``None`` instead of raising, which Detectron2's loaders and largedet's
(:mod:`largedet.data.build`) read as "no sample here": training takes another image,
evaluation leaves the image out. Many unreadable images in a row stop the run with an
error naming the last one, so that a wrong dataset path fails loudly instead of
spinning. An image of more pixels than ``DATALOADER.MAX_IMAGE_PIXELS`` (read from its
header before it is decoded: a decompression bomb, a few KB of JPEG that decodes to
gigabytes) is skipped and counted the same way, instead of stopping the run at the same step
on every resume. The video project does the same for videos
(``largedet_video.data.VideoDataset``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Dict, Optional

from PIL import Image

__all__ = [
    "MAX_CONSECUTIVE_SKIPS",
    "UNREADABLE_ERRORS",
    "ImageTooLarge",
    "SkipUnreadable",
    "check_image_pixels",
    "max_consecutive_skips",
    "max_image_pixels",
]

logger = logging.getLogger(__name__)

# What reading an image raises when the file is the problem. OSError covers a missing or
# unreadable file (FileNotFoundError, PermissionError), bytes that are no image (PIL's
# UnidentifiedImageError) and a truncated or corrupt one ("image file is truncated",
# "broken data stream"); PIL raises SyntaxError for some malformed headers and chunks.
# PIL's DecompressionBombError: an image of more than twice PIL's own pixel limit.
UNREADABLE_ERRORS = (OSError, SyntaxError, Image.DecompressionBombError)


class ImageTooLarge(OSError):
    """An image of more pixels than ``DATALOADER.MAX_IMAGE_PIXELS``: not decoded, unreadable."""


def check_image_pixels(path: str, limit: Optional[int]) -> None:
    """Raise :class:`ImageTooLarge` where the image ``path`` has more than ``limit`` pixels
    (width x height from its header; nothing decoded). ``None``: no limit. A file PIL
    cannot open raises what PIL raises (:data:`UNREADABLE_ERRORS`)."""
    if limit is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                width, height = image.size
        except Image.DecompressionBombError as e:  # over twice PIL's own limit
            raise ImageTooLarge(f"{e}; over DATALOADER.MAX_IMAGE_PIXELS {limit}") from None
    if width * height > limit:
        raise ImageTooLarge(
            f"{width}x{height} = {width * height} pixels, over DATALOADER.MAX_IMAGE_PIXELS {limit}"
        )


# Unreadable images in a row tolerated by default (per process), as the video project's
# DATALOADER.MAX_CONSECUTIVE_SKIPS.
MAX_CONSECUTIVE_SKIPS = 10


class SkipUnreadable:
    """``mapper`` on dataset dicts, with an unreadable image mapped to ``None``.

    Each unreadable image, and each of more than ``max_image_pixels`` pixels
    (:func:`check_image_pixels`, before the mapper decodes it), is logged (file and reason)
    and counted in :attr:`num_skipped` (this process's total: each DataLoader worker has its
    own). After
    ``max_consecutive_skips`` unreadable images in a row in this process the next one
    raises ``RuntimeError`` naming it. Errors other than :data:`UNREADABLE_ERRORS`
    (a bug in a mapper, a wrong annotation) propagate unchanged.

    Args:
        mapper: maps a Detectron2 dataset dict (with ``"file_name"``) to the model's input.
        max_consecutive_skips: unreadable images in a row tolerated, an integer >= 0.
        max_image_pixels: the most pixels (width x height) of an image that is decoded;
            None: no limit but PIL's own.
    """

    def __init__(
        self,
        mapper: Callable[[Dict[str, Any]], Any],
        max_consecutive_skips: int = MAX_CONSECUTIVE_SKIPS,
        max_image_pixels: Optional[int] = None,
    ):
        if max_consecutive_skips < 0:
            raise ValueError(f"max_consecutive_skips must be >= 0, got {max_consecutive_skips}")
        self.mapper = mapper
        self.max_consecutive_skips = max_consecutive_skips
        self.max_image_pixels = max_image_pixels
        self.num_skipped = 0
        self._consecutive = 0

    def __call__(self, dataset_dict: Dict[str, Any]) -> Optional[Any]:
        file_name = dataset_dict.get("file_name", "<no file_name>")
        try:
            if "file_name" in dataset_dict:
                check_image_pixels(dataset_dict["file_name"], self.max_image_pixels)
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


def max_image_pixels(cfg) -> Optional[int]:
    """``DATALOADER.MAX_IMAGE_PIXELS`` of ``cfg`` (a config without it: None, PIL's own limit)."""
    return cfg.DATALOADER.get("MAX_IMAGE_PIXELS", None)
