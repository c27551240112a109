"""The registry of video backbones and ``build_video_backbone(cfg)``."""

from __future__ import annotations

from fvcore.common.registry import Registry
from torch import nn

from ..weights import load_imagenet_weights

__all__ = ["VIDEO_BACKBONE_REGISTRY", "build_video_backbone"]

VIDEO_BACKBONE_REGISTRY = Registry("VIDEO_BACKBONE")
VIDEO_BACKBONE_REGISTRY.__doc__ = """
Video backbones. A registered callable takes the config and returns an
``nn.Module`` with an ``out_channels`` attribute whose forward maps a clip
``(N, T, 3, H, W)`` either to per-frame features ``(N*T, C, h, w)`` (2D
networks) or to clip features ``(N, C, t, h, w)`` (3D networks).
"""


def build_video_backbone(cfg) -> nn.Module:
    """Build ``cfg.MODEL.VIDEO.BACKBONE`` and load ``cfg.MODEL.VIDEO.PRETRAINED``
    (a local torchvision-format ImageNet state dict) when it is set."""
    backbone = VIDEO_BACKBONE_REGISTRY.get(cfg.MODEL.VIDEO.BACKBONE)(cfg)
    if cfg.MODEL.VIDEO.PRETRAINED:
        load_imagenet_weights(backbone, cfg.MODEL.VIDEO.PRETRAINED)
    return backbone
