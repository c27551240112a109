"""Narrow basic-block ResNets with an FPN, for small data and CPU studies.

Detectron2's ``build_resnet_backbone`` fixes ResNet-18/34 at 64 channels in res2. The
batch-scaling study (``study/batch_scaling_study.py``) trains dozens of detectors
on 2 CPU cores, where a ResNet-18 at 64-512 channels spends most of the time; these
builders take any width and depth of basic blocks and reuse Detectron2's ``BasicStem``,
``BasicBlock``, ``ResNet`` and ``FPN`` unchanged.

Config (read only here): ``MODEL.RESNETS.DEPTH`` (10, 18 or 34),
``MODEL.RESNETS.STEM_OUT_CHANNELS``, ``MODEL.RESNETS.RES2_OUT_CHANNELS`` (doubled per
stage), ``MODEL.RESNETS.NORM``, ``MODEL.RESNETS.OUT_FEATURES``,
``MODEL.BACKBONE.FREEZE_AT``; the FPN keys as in Detectron2.
"""

from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone.fpn import FPN, LastLevelMaxPool
from detectron2.modeling.backbone.resnet import BasicBlock, BasicStem, ResNet

__all__ = ["BASIC_BLOCKS_PER_STAGE", "basic_resnet", "build_basic_resnet_backbone"]

# Basic blocks in res2..res5 for each supported depth (2 convs a block, plus stem and fc).
BASIC_BLOCKS_PER_STAGE = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


def basic_resnet(
    *,
    in_channels: int,
    depth: int,
    stem_channels: int,
    res2_channels: int,
    norm: str,
    out_features,
    freeze_at: int = 0,
) -> ResNet:
    """A ResNet of basic blocks; res2 has ``res2_channels`` channels, doubled per stage."""
    if depth not in BASIC_BLOCKS_PER_STAGE:
        raise ValueError(
            f"MODEL.RESNETS.DEPTH must be one of {sorted(BASIC_BLOCKS_PER_STAGE)} for a basic-block "
            f"ResNet, got {depth}"
        )
    for key, value in (("STEM_OUT_CHANNELS", stem_channels), ("RES2_OUT_CHANNELS", res2_channels)):
        if value < 1:
            raise ValueError(f"MODEL.RESNETS.{key} must be >= 1, got {value}")
    stem = BasicStem(in_channels=in_channels, out_channels=stem_channels, norm=norm)
    stages, channels_in, channels_out = [], stem_channels, res2_channels
    for index, num_blocks in enumerate(BASIC_BLOCKS_PER_STAGE[depth]):
        first_stride = 1 if index == 0 else 2
        stages.append(
            ResNet.make_stage(
                block_class=BasicBlock,
                num_blocks=num_blocks,
                stride_per_block=[first_stride] + [1] * (num_blocks - 1),
                in_channels=channels_in,
                out_channels=channels_out,
                norm=norm,
            )
        )
        channels_in, channels_out = channels_out, channels_out * 2
    return ResNet(stem, stages, out_features=out_features, freeze_at=freeze_at)


@BACKBONE_REGISTRY.register()
def build_basic_resnet_backbone(cfg, input_shape: ShapeSpec):
    """``MODEL.BACKBONE.NAME: build_basic_resnet_backbone``: a basic-block ResNet of any
    width (see the module docstring for the keys)."""
    return basic_resnet(
        in_channels=input_shape.channels,
        depth=cfg.MODEL.RESNETS.DEPTH,
        stem_channels=cfg.MODEL.RESNETS.STEM_OUT_CHANNELS,
        res2_channels=cfg.MODEL.RESNETS.RES2_OUT_CHANNELS,
        norm=cfg.MODEL.RESNETS.NORM,
        out_features=cfg.MODEL.RESNETS.OUT_FEATURES,
        freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT,
    )


@BACKBONE_REGISTRY.register()
def build_basic_resnet_fpn_backbone(cfg, input_shape: ShapeSpec):
    """``MODEL.BACKBONE.NAME: build_basic_resnet_fpn_backbone``: the basic-block ResNet
    above under Detectron2's FPN (P2-P6, as ``build_resnet_fpn_backbone``)."""
    return FPN(
        bottom_up=build_basic_resnet_backbone(cfg, input_shape),
        in_features=cfg.MODEL.FPN.IN_FEATURES,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=LastLevelMaxPool(),
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )
