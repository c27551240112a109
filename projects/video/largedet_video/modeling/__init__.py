"""Video models: TSM and TSN ResNets, I3D baselines, the classifier."""

from .backbone import (
    I3D_VARIANTS,
    RESNET_LAYERS,
    VIDEO_BACKBONE_REGISTRY,
    ResNet3D,
    I3DSpec,
    ResNet2D,
    build_video_backbone,
)
from .head import ClassificationHead
from .meta_arch import VideoClassifier
from .temporal_shift import TemporalShift, temporal_shift
from .weights import inflate_conv_weight, load_imagenet_weights

__all__ = [
    "temporal_shift",
    "TemporalShift",
    "VIDEO_BACKBONE_REGISTRY",
    "build_video_backbone",
    "ResNet2D",
    "RESNET_LAYERS",
    "ResNet3D",
    "I3DSpec",
    "I3D_VARIANTS",
    "ClassificationHead",
    "VideoClassifier",
    "load_imagenet_weights",
    "inflate_conv_weight",
]
