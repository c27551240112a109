"""Sub-batch BatchNorm: BN statistics over fixed-size groups of clips.

Multigrid training (Wu et al., CVPR 2020, Sec. 3.4) changes the number of clips
per device from stage to stage, and with it the batch that BN normalizes over;
BN's regularization depends on that batch. Sub-batch BN keeps it fixed: a
device's batch is cut into ``num_splits`` groups of consecutive clips (8 clips
each in the paper), each normalized with its own statistics, all with one
shared affine. Where a device holds fewer clips than a group, the statistics are
instead synchronized over ``num_sync_devices`` consecutive ranks, whose clips
together form the group (the synchronized BN of Detectron2's
``NaiveSyncBatchNorm``, restricted to that set of ranks).

Training updates one set of running statistics, merged over the groups as if the
whole batch had been normalized at once: the mean of the group means, and by the
law of total variance the mean of the group variances plus the variance of the
group means (then Bessel-corrected over the batch, like ``nn.BatchNorm``).
Evaluation, checkpoints and fvcore's ``update_bn_stats`` (precise BN) therefore
see an ordinary BatchNorm: the modules subclass ``nn.BatchNorm2d`` /
``nn.BatchNorm3d`` and keep their parameter and buffer names.

torch's ``nn.SyncBatchNorm`` (what ``MODEL.VIDEO.NORM`` "SyncBN" builds on GPUs)
takes inputs of any rank, so it becomes :class:`SubBatchNormNd`, which does too;
the grouping takes over its synchronization (``num_sync_devices``).

Use :func:`convert_to_subbatch_bn` on a built model, then
:func:`set_bn_grouping` with :func:`bn_grouping` whenever the per-device batch
changes (each stage, and each short-cycle iteration when its shapes have
different batch sizes): it only sets two integers per layer, no rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F
from fvcore.nn.distributed import differentiable_all_gather
from torch import nn

from detectron2.utils import comm

from .batch_norm import NaiveSyncBatchNorm3d

__all__ = [
    "BNGrouping",
    "SubBatchNorm2d",
    "SubBatchNorm3d",
    "SubBatchNormNd",
    "bn_grouping",
    "convert_to_subbatch_bn",
    "convert_from_subbatch_bn",
    "set_bn_grouping",
]


@dataclass(frozen=True)
class BNGrouping:
    """How sub-batch BN groups a device's batch.

    Attributes:
        num_splits: groups of consecutive clips per device, each normalized
            with its own statistics; must divide the per-device batch.
        num_sync_devices: consecutive ranks whose batches are normalized
            together (statistics synchronized); must divide the world size.
            At most one of the two is above 1.
    """

    num_splits: int = 1
    num_sync_devices: int = 1

    def __post_init__(self):
        if self.num_splits < 1 or self.num_sync_devices < 1:
            raise ValueError(f"{self} must have positive counts.")
        if self.num_splits > 1 and self.num_sync_devices > 1:
            raise ValueError(f"{self}: split a device's batch or sync devices, not both.")


def bn_grouping(clips_per_device: int, group_size: int = 8, world_size: int = 1) -> BNGrouping:
    """The grouping that makes BN groups of (about) ``group_size`` clips.

    With at least ``group_size`` clips per device: ``clips // group_size``
    groups, lowered to the nearest count that divides the batch (groups of at
    least ``group_size`` clips). With fewer and ``world_size > 1``: the fewest
    devices, a divisor of ``world_size``, that hold ``group_size`` clips
    together (all devices if none does). With fewer on one device: one group
    of all the clips.
    """
    if clips_per_device < 1 or group_size < 1 or world_size < 1:
        raise ValueError("clips_per_device, group_size and world_size must be positive.")
    if clips_per_device >= group_size:
        splits = clips_per_device // group_size
        while clips_per_device % splits:
            splits -= 1
        return BNGrouping(num_splits=splits)
    devices = 1
    while devices < world_size and (
        devices * clips_per_device < group_size or world_size % devices
    ):
        devices += 1
    return BNGrouping(num_sync_devices=devices)


#: :meth:`_SubBatchNormMixin._split_forward` normalizes each group as a slice of the batch
#: when there are at most this many groups of at least ``SLICED_MIN_VALUES`` values per
#: channel each: a call per group then cost less than moving the groups into channels and
#: back on one CPU thread, and many calls of few values more (benchmarks/RESULTS.md, "Where
#: the short cycle's cost per voxel comes from")
SLICED_MAX_GROUPS = 16
SLICED_MIN_VALUES = 128


class _SubBatchNormMixin:
    """The shared constructor and forward of :class:`SubBatchNorm2d`,
    :class:`SubBatchNorm3d` and :class:`SubBatchNormNd` (before their BatchNorm base in
    the MRO: ``super()`` here is that base)."""

    def __init__(
        self,
        num_features: int,
        num_splits: int = 1,
        num_sync_devices: int = 1,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.set_grouping(BNGrouping(num_splits, num_sync_devices))

    @property
    def grouping(self) -> BNGrouping:
        return BNGrouping(self.num_splits, self.num_sync_devices)

    def set_grouping(self, grouping: BNGrouping) -> None:
        """Change the grouping in place (parameters and statistics are kept)."""
        self.num_splits = grouping.num_splits
        self.num_sync_devices = grouping.num_sync_devices

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_splits={self.num_splits}, "
            f"num_sync_devices={self.num_sync_devices}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        sync = self.num_sync_devices > 1 and comm.get_world_size() > 1
        if not self.training or (self.num_splits == 1 and not sync):
            return super().forward(x)

        n, c = x.shape[:2]
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            # Reduced precision is not enough for the reductions.
            x = x.float()
        if not sync:
            return self._split_forward(x).to(dtype)
        mean, var, count = self._synced_moments(x)  # (1, C), biased, over the synced ranks
        scale = torch.rsqrt(var + self.eps)
        shift = -mean * scale
        if self.weight is not None:
            scale = scale * self.weight
            shift = shift * self.weight
        if self.bias is not None:
            shift = shift + self.bias
        y = torch.addcmul(shift[:, :, None], x.reshape(n, c, -1), scale[:, :, None])
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count)
        return y.reshape(x.shape).to(dtype)

    def _split_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize ``num_splits`` groups of consecutive samples separately, with the native
        batch norm, which also returns each group's statistics (as running statistics of
        momentum 1, unbiased) for :meth:`_update_running_stats`. Two layouts, the same
        numbers: few groups of many values each (:data:`SLICED_MAX_GROUPS`,
        :data:`SLICED_MIN_VALUES`) are normalized one contiguous slice of the batch at a
        time, joined once; otherwise the groups become channels, ``(N, C, ...)`` ->
        ``(N / k, k * C, L)`` (one copy each way), and one call normalizes them all."""
        n, c = x.shape[:2]
        k = self.num_splits
        if n % k:
            raise ValueError(f"A batch of {n} does not split into {k} equal BN groups.")
        count = x.numel() // (k * c)  # values per channel in a group
        mean = torch.zeros(k, c, dtype=x.dtype, device=x.device)
        var = torch.ones(k, c, dtype=x.dtype, device=x.device)
        if k <= SLICED_MAX_GROUPS and count >= SLICED_MIN_VALUES:
            parts = x.split(n // k)
            y = torch.cat(
                [
                    F.batch_norm(part, mean[i], var[i], self.weight, self.bias, True, 1.0, self.eps)
                    for i, part in enumerate(parts)
                ]
            )
        else:
            grouped = x.reshape(k, n // k, c, -1).transpose(0, 1).reshape(n // k, k * c, -1)
            weight = self.weight.repeat(k) if self.weight is not None else None
            bias = self.bias.repeat(k) if self.bias is not None else None
            mean, var = mean.view(-1), var.view(-1)
            y = F.batch_norm(grouped, mean, var, weight, bias, True, 1.0, self.eps)
            y = y.reshape(n // k, k, c, -1).transpose(0, 1).reshape(x.shape)
        if self.track_running_stats:
            biased = var * ((count - 1) / count)  # the kernel refuses one value per channel
            self._update_running_stats(mean.view(k, c), biased.view(k, c), count)
        return y

    def _synced_moments(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, int]:
        d = self.num_sync_devices
        world_size, rank = comm.get_world_size(), comm.get_rank()
        if world_size % d:
            raise ValueError(f"{d} sync devices do not divide the world size {world_size}.")
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        local = torch.cat([x.mean(dims), (x * x).mean(dims)])
        first = rank // d * d
        # Equal batches on every rank (the multigrid sampler's guarantee), so
        # the group's moments are the mean of its ranks' moments.
        moments = torch.stack(differentiable_all_gather(local)[first : first + d]).mean(0)
        mean, meansqr = moments.split(c)
        var = (meansqr - mean * mean).clamp(min=0)
        return mean[None], var[None], d * x.numel() // c

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        """Merge G groups of ``count`` values into one batch and fold it in."""
        batch_mean = mean.mean(0)
        batch_var = var.mean(0) + mean.var(0, correction=0)
        total = count * mean.shape[0]
        batch_var = batch_var * (total / max(total - 1, 1))
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
        self.running_mean.lerp_(batch_mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(batch_var.to(self.running_var.dtype), factor)


class SubBatchNorm2d(_SubBatchNormMixin, nn.BatchNorm2d):
    """Sub-batch BN for ``(N, C, H, W)`` inputs; for TSM's ``(N*T, C, H, W)``
    the frames of a clip are consecutive, so ``num_splits`` groups of
    consecutive rows are groups of whole clips whenever ``num_splits``
    divides ``N``.

    Args:
        num_features: ``C``.
        num_splits, num_sync_devices: the grouping (see :class:`BNGrouping`);
            used in training only.
        eps, momentum, affine, track_running_stats: as ``nn.BatchNorm2d``.
    """


class SubBatchNorm3d(_SubBatchNormMixin, nn.BatchNorm3d):
    """Sub-batch BN for ``(N, C, T, H, W)`` inputs; arguments as
    :class:`SubBatchNorm2d`."""


class SubBatchNormNd(_SubBatchNormMixin, nn.BatchNorm2d):
    """Sub-batch BN for ``(N, C, ...)`` inputs of any rank: what ``nn.SyncBatchNorm``
    (which takes any rank) becomes. A ``BatchNorm2d`` for evaluation, checkpoints and
    precise BN; per-channel statistics over N and all trailing axes, as
    ``nn.SyncBatchNorm``'s. Arguments as :class:`SubBatchNorm2d`."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


# Checked in order: NaiveSyncBatchNorm3d is a BatchNorm2d subclass for 5D inputs.
_SUB_BATCH_OF = (
    (nn.SyncBatchNorm, SubBatchNormNd),
    (NaiveSyncBatchNorm3d, SubBatchNorm3d),
    (nn.BatchNorm3d, SubBatchNorm3d),
    (nn.BatchNorm2d, SubBatchNorm2d),
)
_PLAIN_OF = (
    (SubBatchNormNd, nn.SyncBatchNorm),
    (SubBatchNorm3d, nn.BatchNorm3d),
    (SubBatchNorm2d, nn.BatchNorm2d),
)


def _transfer(src: nn.modules.batchnorm._BatchNorm, dst: nn.modules.batchnorm._BatchNorm):
    """Give ``dst`` the very parameters and buffers of ``src`` (shared, not
    copied, so an optimizer holding them keeps its state), and its mode. A parameter
    ``src`` does not have (``bias=False``) is absent from ``dst`` too."""
    for name in list(dst._parameters):
        if src._parameters.get(name) is None:
            dst.register_parameter(name, None)
    for name, param in src.named_parameters(recurse=False):
        setattr(dst, name, param)
    for name, buf in src.named_buffers(recurse=False):
        setattr(dst, name, buf)
    dst.train(src.training)
    return dst


def convert_to_subbatch_bn(module: nn.Module, grouping: BNGrouping = BNGrouping()) -> nn.Module:
    """Replace every batch norm in ``module`` by the sub-batch version with ``grouping``,
    sharing its parameters and statistics: ``nn.BatchNorm2d`` / ``nn.BatchNorm3d`` and
    their subclasses (Detectron2's ``BatchNorm2d`` and ``NaiveSyncBatchNorm``, and
    :class:`NaiveSyncBatchNorm3d`), and ``nn.SyncBatchNorm`` (as :class:`SubBatchNormNd`),
    whose synchronization the grouping takes over. Layers already sub-batch get
    ``grouping``; ``FrozenBatchNorm2d`` and norms other than batch norms are left alone.
    Children are replaced in place; the (possibly new) root is returned.

    Raises ``ValueError`` naming the layer for a batch norm that cannot be taken over
    (``BatchNorm1d``, an ``nn.SyncBatchNorm`` with its own process group, other
    ``_BatchNorm`` subclasses): it would silently keep its own statistics.
    """
    return _convert_to_subbatch_bn(module, grouping, "")


def _convert_to_subbatch_bn(module: nn.Module, grouping: BNGrouping, name: str) -> nn.Module:
    if isinstance(module, _SubBatchNormMixin):
        module.set_grouping(grouping)
        return module
    for bn_cls, sub_cls in _SUB_BATCH_OF:
        if isinstance(module, bn_cls):
            if isinstance(module, nn.SyncBatchNorm) and module.process_group is not None:
                raise ValueError(
                    f"Sub-batch BN cannot take over {name or 'the module'} (nn.SyncBatchNorm with its "
                    "own process group): its groups synchronize over consecutive ranks of the world."
                )
            new = sub_cls(
                module.num_features,
                grouping.num_splits,
                grouping.num_sync_devices,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            return _transfer(module, new)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        raise ValueError(
            f"Sub-batch BN cannot take over {name or 'the module'} ({type(module).__name__}): "
            "it converts BatchNorm2d, BatchNorm3d and SyncBatchNorm."
        )
    for child_name, child in module.named_children():
        new_child = _convert_to_subbatch_bn(
            child, grouping, f"{name}.{child_name}" if name else child_name
        )
        if new_child is not child:
            setattr(module, child_name, new_child)
    return module


def convert_from_subbatch_bn(module: nn.Module) -> nn.Module:
    """The inverse of :func:`convert_to_subbatch_bn`: every sub-batch layer
    becomes a plain ``nn.BatchNorm2d`` / ``nn.BatchNorm3d`` (:class:`SubBatchNormNd`:
    ``nn.SyncBatchNorm`` again) sharing its parameters and statistics (e.g. for
    export, or to train without groups)."""
    for sub_cls, bn_cls in _PLAIN_OF:
        if isinstance(module, sub_cls):
            new = bn_cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            return _transfer(module, new)
    for name, child in module.named_children():
        new_child = convert_from_subbatch_bn(child)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def set_bn_grouping(module: nn.Module, grouping: BNGrouping) -> int:
    """Set ``grouping`` on every sub-batch BN layer in ``module``, in place;
    returns how many layers it set."""
    count = 0
    for m in module.modules():
        if isinstance(m, _SubBatchNormMixin):
            m.set_grouping(grouping)
            count += 1
    return count
