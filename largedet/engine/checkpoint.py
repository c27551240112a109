"""Checkpoints that are complete or absent, never half-written."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import torch
from detectron2.checkpoint import DetectionCheckpointer

__all__ = ["AtomicCheckpointer"]

logger = logging.getLogger(__name__)


def _write_atomically(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, flush it to disk, then
    rename it to ``path`` (``os.replace``: atomic on POSIX and Windows). On any error the
    temporary file is removed and ``path`` is untouched."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class AtomicCheckpointer(DetectionCheckpointer):
    """Detectron2's ``DetectionCheckpointer`` whose files are written atomically.

    A checkpoint is written to a temporary file in the same folder and renamed into
    place once complete; the ``last_checkpoint`` tag is written the same way, and only
    after the checkpoint file is in place. A crash at any moment leaves the previous
    checkpoint and tag intact. Folders that are not local paths (``PathManager`` URLs)
    are written by ``DetectionCheckpointer`` as usual.
    """

    def _is_local(self) -> bool:
        return "://" not in self.save_dir

    def save(self, name: str, **kwargs: Any) -> None:
        if not self._is_local():
            return super().save(name, **kwargs)
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        basename = f"{name}.pth"
        save_file = os.path.join(self.save_dir, basename)
        logger.info("Saving checkpoint to %s", save_file)
        os.makedirs(self.save_dir, exist_ok=True)
        _write_atomically(save_file, lambda f: torch.save(data, f))
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        if not self._is_local():
            return super().tag_last_checkpoint(last_filename_basename)
        _write_atomically(
            os.path.join(self.save_dir, "last_checkpoint"),
            lambda f: f.write(last_filename_basename.encode()),
        )
