"""I3D-style 3D ResNet-50/101 baselines, for TSM's throughput comparison.

Two variants, described as data (:class:`I3DSpec`):

- ``"3x3x3"``: every bottleneck's 3x3 conv inflated to 3x3x3, a 5x7x7 stem, and
  temporal pooling (stride 2 in time after the stem and again after res2), as in
  the inflated ResNet-50 I3D of Carreira & Zisserman / Wang et al.
- ``"3x1x1"``: a 1x7x7 stem, the first 1x1 conv of every block in res4 and res5
  inflated to 3x1x1, and no temporal pooling (full temporal resolution
  throughout), as in the "slow" 3D ResNet-50 of Feichtenhofer et al.

Parameter names match torchvision's 2D ResNet, so an ImageNet state dict is
inflated into it by :func:`largedet_video.modeling.weights.load_imagenet_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from .build import VIDEO_BACKBONE_REGISTRY
from .resnet import RESNET_LAYERS

__all__ = ["I3DSpec", "I3D_VARIANTS", "ResNet3D", "Bottleneck3D", "I3DResNet"]


@dataclass(frozen=True)
class I3DSpec:
    """Temporal extents of a 3D ResNet's kernels.

    Attributes:
        stem_t: temporal kernel of the 7x7 stem conv.
        conv1_t: temporal kernel of each block's first (1x1) conv, per stage res2..res5.
        conv2_t: temporal kernel of each block's 3x3 conv, per stage res2..res5.
        temporal_pool: halve the time axis after the stem and after res2.
    """

    stem_t: int
    conv1_t: Tuple[int, int, int, int]
    conv2_t: Tuple[int, int, int, int]
    temporal_pool: bool


I3D_VARIANTS: Dict[str, I3DSpec] = {
    "3x3x3": I3DSpec(stem_t=5, conv1_t=(1, 1, 1, 1), conv2_t=(3, 3, 3, 3), temporal_pool=True),
    "3x1x1": I3DSpec(stem_t=1, conv1_t=(1, 1, 3, 3), conv2_t=(1, 1, 1, 1), temporal_pool=False),
}


def _conv3d(in_ch: int, out_ch: int, kt: int, k: int, stride: int = 1) -> nn.Conv3d:
    return nn.Conv3d(
        in_ch,
        out_ch,
        (kt, k, k),
        stride=(1, stride, stride),
        padding=(kt // 2, k // 2, k // 2),
        bias=False,
    )


class Bottleneck3D(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, conv1_t: int, conv2_t: int):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv3d(in_ch, width, conv1_t, 1)
        self.bn1 = nn.BatchNorm3d(width)
        self.conv2 = _conv3d(width, width, conv2_t, 3, stride)
        self.bn2 = nn.BatchNorm3d(width)
        self.conv3 = _conv3d(width, out_ch, 1, 1)
        self.bn3 = nn.BatchNorm3d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: Optional[nn.Sequential] = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                _conv3d(in_ch, out_ch, 1, 1, stride), nn.BatchNorm3d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet3D(nn.Module):
    """A 3D bottleneck ResNet. Input ``(N, T, 3, H, W)`` (normalized); output
    ``(N, C, t, H/32, W/32)`` with ``t = T/4`` when the spec pools in time, else ``T``."""

    def __init__(
        self,
        spec: I3DSpec,
        depth: int = 50,
        width: int = 64,
        zero_init_residual: bool = False,
    ):
        super().__init__()
        kind, layers = RESNET_LAYERS[depth]
        if kind != "bottleneck":
            raise ValueError(f"I3DResNet needs a bottleneck depth (50, 101, 152), got {depth}")
        self.spec = spec
        self.conv1 = _conv3d(3, width, spec.stem_t, 7, stride=2)
        self.bn1 = nn.BatchNorm3d(width)
        self.relu = nn.ReLU(inplace=True)
        if spec.temporal_pool:
            self.maxpool = nn.MaxPool3d((3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1))
            self.pool2: nn.Module = nn.MaxPool3d((3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0))
        else:
            self.maxpool = nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
            self.pool2 = nn.Identity()
        in_ch = width
        for stage, num_blocks in enumerate(layers):
            stage_width = width * 2**stage
            blocks = []
            for i in range(num_blocks):
                stride = 2 if (i == 0 and stage > 0) else 1
                blocks.append(
                    Bottleneck3D(
                        in_ch, stage_width, stride, spec.conv1_t[stage], spec.conv2_t[stage]
                    )
                )
                in_ch = stage_width * Bottleneck3D.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.out_channels = in_ch

        for m in self.modules():
            if isinstance(m, nn.Conv3d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm3d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck3D):
                    nn.init.zeros_(m.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2).contiguous()  # (N, 3, T, H, W)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool2(self.layer1(x))
        x = self.layer2(x)
        x = self.layer3(x)
        return self.layer4(x)


@VIDEO_BACKBONE_REGISTRY.register()
def I3DResNet(cfg) -> "ResNet3D":
    """I3D ResNet; the variant is ``MODEL.VIDEO.I3D.VARIANT`` ("3x3x3" or "3x1x1")."""
    v = cfg.MODEL.VIDEO
    if v.I3D.VARIANT not in I3D_VARIANTS:
        raise ValueError(
            f"MODEL.VIDEO.I3D.VARIANT must be one of {sorted(I3D_VARIANTS)}, got {v.I3D.VARIANT!r}"
        )
    return ResNet3D(
        I3D_VARIANTS[v.I3D.VARIANT],
        depth=v.RESNET.DEPTH,
        width=v.RESNET.WIDTH,
        zero_init_residual=v.RESNET.ZERO_INIT_RESIDUAL,
    )
