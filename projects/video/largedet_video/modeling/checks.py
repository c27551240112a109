"""The model keys of the video project, checked before launch against what this room
builds: :data:`MODEL_RULES` (the ResNet depths, the shift's implementations and the I3D
variants it has), the backbone's name in ``VIDEO_BACKBONE_REGISTRY`` and the ImageNet
weights file. Each error is one :class:`~largedet.config.errors.ConfigError` line naming
the key."""

from __future__ import annotations

import os

from detectron2.config import CfgNode
from largedet.config.errors import ConfigError
from largedet.config.keys import Rule, one_of

from .backbone import I3D_VARIANTS, RESNET_LAYERS, VIDEO_BACKBONE_REGISTRY
from .temporal_shift import SHIFT_IMPLS

__all__ = ["MODEL_RULES", "check_backbone_name", "check_pretrained_weights"]

#: The video model keys whose values name what this room has (checked before launch with
#: the keys' own rules, :data:`largedet_video.config.VIDEO_KEYS`).
MODEL_RULES = (
    Rule("MODEL.VIDEO.RESNET.DEPTH", *one_of(RESNET_LAYERS)),
    Rule("MODEL.VIDEO.TSM.SHIFT_IMPL", *one_of(SHIFT_IMPLS)),
    Rule("MODEL.VIDEO.I3D.VARIANT", *one_of(I3D_VARIANTS)),
)


def check_backbone_name(cfg: CfgNode) -> None:
    """``MODEL.VIDEO.BACKBONE`` names a builder of ``VIDEO_BACKBONE_REGISTRY`` (the video
    project's or one a ``--import`` module registered)."""
    backbone = cfg.MODEL.VIDEO.BACKBONE
    names = sorted(name for name, _ in VIDEO_BACKBONE_REGISTRY)
    if backbone not in names:
        raise ConfigError(
            f"MODEL.VIDEO.BACKBONE: {backbone!r} is not registered; registered: {', '.join(names)}"
        )


def check_pretrained_weights(cfg: CfgNode) -> None:
    """``MODEL.VIDEO.PRETRAINED``, where set, is a file."""
    path = cfg.MODEL.VIDEO.PRETRAINED
    if path and not os.path.isfile(os.path.expanduser(path)):
        raise ConfigError(
            f"{path}: ImageNet weights (MODEL.VIDEO.PRETRAINED) not found; set it to '' "
            "to start from scratch"
        )
