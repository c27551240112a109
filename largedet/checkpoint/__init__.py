"""Checkpoints: written whole or not at all, resumed from the newest complete one, weights
from ``.pkl`` files read without running code, a full disk one clear error
(:mod:`.atomic`); the checks of the output folder and the weights before launch
(:mod:`.checks`)."""

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
    "load_model_zoo_pickle",
    "warn_if_low_space",
]
