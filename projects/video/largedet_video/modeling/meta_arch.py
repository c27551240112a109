"""``VideoClassifier``: a video backbone, a classification head, and the
normalization of raw frames; registered in Detectron2's META_ARCH_REGISTRY so
that ``detectron2.modeling.build_model`` and ``DefaultTrainer`` build it."""

from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn.functional as F
from detectron2.config import configurable
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.utils import comm
from detectron2.utils.events import get_event_storage
from largedet.layers import convert_sync_batchnorm
from torch import nn

from ..layers import BNGrouping, bn_grouping, convert_to_subbatch_bn, set_bn_grouping
from ..multigrid import multigrid_enabled

from .backbone import build_video_backbone
from .head import ClassificationHead

__all__ = ["VideoClassifier"]


@META_ARCH_REGISTRY.register()
class VideoClassifier(nn.Module):
    """Clip classification.

    Input: a batch dict from :mod:`largedet_video.data`:

    - ``"clip"``: uint8 or float RGB frames, ``(N, T, 3, H, W)`` for training, or
      ``(N, V, T, 3, H, W)`` for testing with V views per video (V = clips x crops);
    - ``"label"``: ``(N,)`` int64 class indices (training).

    Output: in training ``{"loss_cls": cross-entropy}``; in eval mode
    ``{"scores": (N, K)}``, the softmax scores averaged over the V views.

    With ``bn_group_size`` G > 0 the backbone's BN layers, synchronized ones included,
    are sub-batch BN (:mod:`largedet_video.layers.subbatch_bn`): in training, whenever
    the number of clips per device changes (multigrid stages and short cycles), the
    model regroups them into groups of G clips (or syncs enough devices to make G), in
    place. A backbone with no batch norm, or one that sub-batch BN cannot take over, is
    an error.
    """

    @configurable
    def __init__(
        self,
        *,
        backbone: nn.Module,
        head: ClassificationHead,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        bn_group_size: int = 0,
    ):
        """
        Args:
            backbone: maps ``(N, T, 3, H, W)`` to features (see VIDEO_BACKBONE_REGISTRY).
            head: maps those features to ``(N, K)`` logits.
            pixel_mean, pixel_std: per-channel RGB statistics on the 0-255 scale.
            bn_group_size: clips per BN group in training (0: BN as built).
        """
        super().__init__()
        if bn_group_size < 0:
            raise ValueError(f"bn_group_size must be >= 0, got {bn_group_size}")
        if bn_group_size:
            backbone = self._subbatch_backbone(backbone, bn_group_size)
        self.backbone = backbone
        self.bn_group_size = bn_group_size
        self._grouped_batch = 0  # the per-device batch the BN grouping was set for
        self.head = head
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(3, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(3, 1, 1), False)

    @staticmethod
    def _subbatch_backbone(backbone: nn.Module, bn_group_size: int) -> nn.Module:
        """``backbone`` with sub-batch BN; an error naming the key where it would do nothing."""
        key = f"MULTIGRID.BN_BASE_SIZE {bn_group_size} (bn_group_size)"
        try:
            backbone = convert_to_subbatch_bn(backbone)
        except ValueError as e:
            raise ValueError(f"{key}: {e} Set it to 0 to keep the backbone's norms.") from e
        # set_bn_grouping counts the sub-batch layers (the grouping is the one just set)
        if not set_bn_grouping(backbone, BNGrouping()):
            raise ValueError(f"{key}: the backbone has no batch norm to group; set it to 0.")
        return backbone

    @classmethod
    def from_config(cls, cfg):
        v = cfg.MODEL.VIDEO
        backbone = build_video_backbone(cfg)
        if v.NORM == "SyncBN":
            backbone = convert_sync_batchnorm(backbone, cfg.MODEL.DEVICE)
        elif v.NORM != "BN":
            raise ValueError(f"MODEL.VIDEO.NORM must be 'BN' or 'SyncBN', got {v.NORM!r}")
        return {
            "backbone": backbone,
            "head": ClassificationHead(backbone.out_channels, v.NUM_CLASSES, v.DROPOUT),
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "bn_group_size": cfg.MULTIGRID.BN_BASE_SIZE if multigrid_enabled(cfg) else 0,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def preprocess(self, clip: torch.Tensor) -> torch.Tensor:
        """Raw frames (..., 3, H, W) to normalized float on the model's device."""
        clip = clip.to(self.device, non_blocking=True).float()
        return (clip - self.pixel_mean) / self.pixel_std

    def logits(self, clips: torch.Tensor) -> torch.Tensor:
        """Normalized clips ``(N, T, 3, H, W)`` to logits ``(N, K)``."""
        return self.head(self.backbone(clips), clips.shape[0])

    def forward(self, batched: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        clip = batched["clip"]
        if self.training:
            if self.bn_group_size and clip.shape[0] != self._grouped_batch:
                grouping = bn_grouping(clip.shape[0], self.bn_group_size, comm.get_world_size())
                set_bn_grouping(self.backbone, grouping)
                self._grouped_batch = clip.shape[0]
            logits = self.logits(self.preprocess(clip))
            labels = batched["label"].to(self.device)
            accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
            get_event_storage().put_scalar("cls_accuracy", accuracy.item())
            return {"loss_cls": F.cross_entropy(logits, labels)}
        if clip.dim() == 5:
            clip = clip.unsqueeze(1)
        n, v = clip.shape[:2]
        logits = self.logits(self.preprocess(clip.flatten(0, 1)))
        scores = logits.softmax(dim=1).view(n, v, -1).mean(dim=1)
        return {"scores": scores}
