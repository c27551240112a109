"""Synchronized batch norm of the video models: largedet's (``nn.SyncBatchNorm``
on GPUs; Detectron2's ``NaiveSyncBatchNorm`` and largedet's
``NaiveSyncBatchNormNd`` for 3D inputs on the CPU)."""

from largedet.layers import NaiveSyncBatchNormNd, convert_sync_batchnorm

__all__ = ["NaiveSyncBatchNorm3d", "convert_sync_batchnorm"]

#: Synchronized BN for ``(N, C, T, H, W)`` inputs on the CPU (largedet's class
#: takes any rank; the name says what the video models use it for).
NaiveSyncBatchNorm3d = NaiveSyncBatchNormNd
