"""Models and backbones largedet adds to Detectron2's registries."""

from .backbone import BASIC_BLOCKS_PER_STAGE, basic_resnet, build_basic_resnet_backbone

__all__ = ["BASIC_BLOCKS_PER_STAGE", "basic_resnet", "build_basic_resnet_backbone"]
