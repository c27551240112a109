"""Denormal floats flushed to zero on the CPU, for the length of a run (``CPU_FLUSH_DENORMAL``).

An x86 core computes on a denormal float (magnitude below 1.2e-38 in float32) tens of times
more slowly than on a normal one. A model trained from scratch on the CPU can carry many of
them in its activations and gradients: the video study's multigrid cells (sub-batch BN, the
short cycle's shapes) ran about five times more slowly per voxel with them than without
(projects/video/README.md, "Multigrid: where the time goes"). Flushing them (torch's
``set_flush_denormal``: the SSE flush-to-zero and denormals-are-zero modes) changes no value
of 1.2e-38 or more, and a run stays deterministic with it.

The mode is a setting of the calling thread (and of the threads it starts later); torch has
no getter for it, so :func:`flush_denormal_on` reads it from a product that a flushed core
rounds to zero. :func:`denormals_flushed` sets it for a run and puts the earlier mode back
after, so that code run in the same process after largedet's training sees torch's default.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch

__all__ = ["denormals_flushed", "flush_denormal_on"]

logger = logging.getLogger(__name__)

_DENORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


def flush_denormal_on() -> bool:
    """Whether this thread flushes denormal floats to zero (a denormal times one is zero)."""
    return float(torch.tensor([_DENORMAL], dtype=torch.float32).mul(1.0)[0]) == 0.0


@contextlib.contextmanager
def denormals_flushed(cfg) -> Iterator[bool]:
    """Within the block, denormal floats flushed to zero where ``cfg`` trains on the CPU
    (``MODEL.DEVICE`` "cpu") with ``CPU_FLUSH_DENORMAL`` (one line says so); yields whether
    they are. The earlier mode is put back after the block, also on an error."""
    wanted = cfg.MODEL.DEVICE == "cpu" and bool(cfg.get("CPU_FLUSH_DENORMAL", False))
    before = flush_denormal_on()
    if wanted and not before and torch.set_flush_denormal(True):
        logger.info("CPU_FLUSH_DENORMAL: denormal floats (below 1.2e-38) are flushed to zero on the CPU")
    try:
        yield flush_denormal_on()
    finally:
        if flush_denormal_on() != before:
            torch.set_flush_denormal(before)
