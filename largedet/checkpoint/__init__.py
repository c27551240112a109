"""Checkpoints: written whole or not at all, resumed from the complete one of the latest
iteration, never written over by an earlier iteration, weights
from ``.pkl`` and ``.pth`` files checked without running code, weights at a URL that cannot
be fetched and a full disk each one clear error (:mod:`.atomic`); the checks of the output
folder and the weights before launch (:mod:`.checks`)."""

from .atomic import (
    AtomicCheckpointer,
    CheckpointSpaceError,
    DiskFullError,
    FoundCheckpoint,
    LaterCheckpointError,
    NoCompleteCheckpointError,
    UnsafeWeightsError,
    WeightsUnavailableError,
    check_output_dir,
    check_torch_weights,
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
    "LaterCheckpointError",
    "NoCompleteCheckpointError",
    "UnsafeWeightsError",
    "WeightsUnavailableError",
    "check_output_dir",
    "check_torch_weights",
    "is_disk_full",
    "last_checkpoint_state",
    "load_model_zoo_pickle",
    "warn_if_low_space",
]
