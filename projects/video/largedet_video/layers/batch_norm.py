"""Synchronized batch norm for the video models, on GPUs and on the CPU."""

from __future__ import annotations

import torch
from detectron2.layers import NaiveSyncBatchNorm
from torch import nn

__all__ = ["NaiveSyncBatchNorm3d", "convert_sync_batchnorm"]


class NaiveSyncBatchNorm3d(NaiveSyncBatchNorm):
    """Detectron2's ``NaiveSyncBatchNorm`` (all-reduce of mean and mean of
    squares; works with gloo on the CPU) for ``(N, C, T, H, W)`` inputs: folding
    T and H into one axis leaves the per-channel statistics unchanged."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        n, c, t, h, w = input.shape
        return super().forward(input.reshape(n, c, t, h * w)).view(n, c, t, h, w)


def _copy_bn(src: nn.modules.batchnorm._BatchNorm, cls) -> nn.Module:
    dst = cls(src.num_features, eps=src.eps, momentum=src.momentum, affine=src.affine)
    dst.load_state_dict(src.state_dict())
    dst.train(src.training)
    return dst.to(src.weight.device if src.affine else src.running_mean.device)


def convert_sync_batchnorm(module: nn.Module, device: str) -> nn.Module:
    """Replace every BatchNorm of ``module`` by a synchronized one.

    On CUDA this is ``nn.SyncBatchNorm`` (any input rank). On the CPU, where
    ``nn.SyncBatchNorm`` does not run, 2D BN becomes Detectron2's
    ``NaiveSyncBatchNorm`` and 3D BN :class:`NaiveSyncBatchNorm3d`. With a
    single process all of them compute plain BN.
    """
    if torch.device(device).type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if isinstance(module, nn.BatchNorm3d):
        return _copy_bn(module, NaiveSyncBatchNorm3d)
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, NaiveSyncBatchNorm):
        return _copy_bn(module, NaiveSyncBatchNorm)
    for name, child in module.named_children():
        new = convert_sync_batchnorm(child, device)
        if new is not child:
            setattr(module, name, new)
    return module
