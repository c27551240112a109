from .build import VIDEO_BACKBONE_REGISTRY, build_video_backbone
from .resnet import RESNET_LAYERS, ResNet2D
from .i3d import I3D_VARIANTS, I3DSpec, ResNet3D

__all__ = [
    "VIDEO_BACKBONE_REGISTRY",
    "build_video_backbone",
    "RESNET_LAYERS",
    "ResNet2D",
    "I3D_VARIANTS",
    "ResNet3D",
    "I3DSpec",
]
