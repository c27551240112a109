"""Multigrid's keys, checked before launch: :data:`MULTIGRID_RULES` (multigrid rescales a
step schedule) and :func:`check_batch_owner` (one owner of each step's batch). Each error is
one :class:`~largedet.config.errors.ConfigError` line naming the key."""

from __future__ import annotations

from detectron2.config import CfgNode
from largedet.config.errors import ConfigError
from largedet.config.keys import Rule

from .build import multigrid_enabled

__all__ = ["MULTIGRID_RULES", "check_batch_owner"]

#: Multigrid rescales a step schedule (its stages are the LR steps): Detectron2's key,
#: restricted where multigrid is on.
MULTIGRID_RULES = (
    Rule(
        "SOLVER.LR_SCHEDULER_NAME",
        "'WarmupMultiStepLR' with multigrid, which rescales a step schedule",
        lambda v: v == "WarmupMultiStepLR",
        multigrid_enabled,
    ),
)


def check_batch_owner(cfg: CfgNode) -> None:
    """A training run sets each step's batch by ``SOLVER.BATCH_RAMP`` or by multigrid, not
    both."""
    if cfg.SOLVER.BATCH_RAMP.BATCHES and multigrid_enabled(cfg):
        raise ConfigError(
            "SOLVER.BATCH_RAMP: a batch ramp and MULTIGRID both set the batch of each step; "
            "use one of them"
        )
