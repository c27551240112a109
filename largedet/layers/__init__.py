"""Layers: synchronized batch norm chosen for the device."""

from .batch_norm import (
    NaiveSyncBatchNormNd,
    convert_sync_batchnorm,
    resolve_sync_batchnorm,
    sync_batchnorm_type,
)

__all__ = [
    "NaiveSyncBatchNormNd",
    "convert_sync_batchnorm",
    "resolve_sync_batchnorm",
    "sync_batchnorm_type",
]
