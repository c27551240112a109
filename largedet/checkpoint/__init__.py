"""Checkpoints: written whole or not at all, resumed from the newest complete one, weights
from ``.pkl`` files read without running code, a full disk one clear error
(:mod:`.atomic`)."""

from .atomic import (
    AtomicCheckpointer,
    CheckpointSpaceError,
    DiskFullError,
    FoundCheckpoint,
    NoCompleteCheckpointError,
    UnsafeWeightsError,
    check_output_dir,
    is_disk_full,
    last_checkpoint_state,
    check_torch_weights,
    load_model_zoo_pickle,
    warn_if_low_space,
)

__all__ = [
    "AtomicCheckpointer",
    "CheckpointSpaceError",
    "DiskFullError",
    "FoundCheckpoint",
    "NoCompleteCheckpointError",
    "UnsafeWeightsError",
    "check_output_dir",
    "is_disk_full",
    "last_checkpoint_state",
    "check_torch_weights",
    "load_model_zoo_pickle",
    "warn_if_low_space",
]
