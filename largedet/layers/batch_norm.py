"""Synchronized batch norm on any device (LargeDet's second ingredient).

With a large global batch split into small per-device micro-batches, BN statistics
over 1 or 2 images are too noisy; synchronized BN computes them over the micro-batch
of every device at once. torch's ``nn.SyncBatchNorm`` only runs on GPUs; on the CPU
(several gloo processes) Detectron2's ``NaiveSyncBatchNorm`` does the same with an
all-reduce of each channel's mean and mean of squares. Both compute plain BN in a
single process. ``FrozenBatchNorm2d`` is not a batch norm in this sense (no statistics
are computed) and is never converted.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from detectron2.layers import NaiveSyncBatchNorm
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = [
    "NaiveSyncBatchNormNd",
    "convert_sync_batchnorm",
    "resolve_sync_batchnorm",
    "sync_batchnorm_type",
]

Device = Union[str, torch.device]


class NaiveSyncBatchNormNd(NaiveSyncBatchNorm):
    """Detectron2's ``NaiveSyncBatchNorm`` for inputs of any rank: (N, C), (N, C, L),
    (N, C, H, W) or (N, C, T, H, W). Per-channel statistics over N and all trailing axes
    do not change when those axes are flattened into one, so the input is viewed as
    (N, C, L, 1) for the 2D implementation."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 4:
            return super().forward(input)
        if input.dim() < 2:
            raise ValueError(f"expected an input of shape (N, C, ...), got {tuple(input.shape)}")
        n, c = input.shape[:2]
        return super().forward(input.reshape(n, c, -1, 1)).view(input.shape)


def sync_batchnorm_type(device: Device, input_dim: Optional[int] = 4) -> type:
    """The synchronized BN class for ``device`` and inputs of ``input_dim`` axes (None: any).

    CUDA: ``nn.SyncBatchNorm`` (any rank). Elsewhere: Detectron2's ``NaiveSyncBatchNorm``
    for (N, C, H, W) inputs, :class:`NaiveSyncBatchNormNd` otherwise.
    """
    if torch.device(device).type == "cuda":
        return nn.SyncBatchNorm
    return NaiveSyncBatchNorm if input_dim == 4 else NaiveSyncBatchNormNd


def _input_dim(bn: _BatchNorm) -> Optional[int]:
    if isinstance(bn, nn.SyncBatchNorm):
        return None
    for cls, dim in ((nn.BatchNorm2d, 4), (nn.BatchNorm3d, 5), (nn.BatchNorm1d, None)):
        if isinstance(bn, cls):
            return dim
    return None


def _device_of(module: nn.Module) -> torch.device:
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _rebuild(bn: _BatchNorm, cls: type) -> nn.Module:
    """A ``cls`` with ``bn``'s hyperparameters, state, device, dtype, mode and requires_grad flags."""
    new = cls(
        bn.num_features,
        eps=bn.eps,
        momentum=bn.momentum,
        affine=bn.affine,
        track_running_stats=bn.track_running_stats,
    )
    new.load_state_dict(bn.state_dict())
    reference = next(iter(list(bn.parameters()) + list(bn.buffers())), None)
    if reference is not None:
        new.to(reference.device)
        if reference.is_floating_point():
            new.to(reference.dtype)
    for name, p in bn.named_parameters(recurse=False):
        getattr(new, name).requires_grad_(p.requires_grad)
    new.train(bn.training)
    return new


def _replace(module: nn.Module, convert) -> nn.Module:
    new = convert(module)
    if new is not module:
        return new
    for name, child in module.named_children():
        replaced = _replace(child, convert)
        if replaced is not child:
            setattr(module, name, replaced)
    return module


def convert_sync_batchnorm(module: nn.Module, device: Optional[Device] = None) -> nn.Module:
    """Replace every batch norm of ``module`` (BatchNorm1d/2d/3d, synchronized or not) by the
    synchronized one for ``device`` (default: where ``module``'s tensors are), keeping its
    parameters, statistics and mode; returns the module (a new one if ``module`` itself is a
    batch norm). ``FrozenBatchNorm2d`` and other norms are left as they are.

    On CUDA this is ``nn.SyncBatchNorm.convert_sync_batchnorm``; elsewhere 2D BN becomes
    Detectron2's ``NaiveSyncBatchNorm`` and other ranks :class:`NaiveSyncBatchNormNd`.
    Call it before building the optimizer (the parameters are new tensors).
    """
    device = torch.device(device) if device is not None else _device_of(module)
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)

    def convert(m: nn.Module) -> nn.Module:
        if not isinstance(m, _BatchNorm) or isinstance(m, NaiveSyncBatchNorm):
            return m
        return _rebuild(m, sync_batchnorm_type(device, _input_dim(m)))

    return _replace(module, convert)


def resolve_sync_batchnorm(module: nn.Module, device: Optional[Device] = None) -> nn.Module:
    """Make the synchronized batch norms of ``module`` runnable on ``device``: on a device
    other than CUDA, each ``nn.SyncBatchNorm`` (what Detectron2's ``get_norm("SyncBN")``
    builds) becomes a :class:`NaiveSyncBatchNormNd`; plain BN, Detectron2's
    ``NaiveSyncBatchNorm`` and ``FrozenBatchNorm2d`` stay. On CUDA nothing changes.
    Returns the module."""
    device = torch.device(device) if device is not None else _device_of(module)
    if device.type == "cuda":
        return module

    def convert(m: nn.Module) -> nn.Module:
        if type(m) is not nn.SyncBatchNorm:
            return m
        return _rebuild(m, NaiveSyncBatchNormNd)

    return _replace(module, convert)
