"""2D ResNets over the frames of a clip: TSM (with the residual shift) and TSN.

Module and parameter names follow torchvision's ResNet (``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer1.0.downsample.0``, ...) so that an ImageNet state
dict saved from torchvision loads as it is.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from ..temporal_shift import SHIFT_IMPLS, temporal_shift
from .build import VIDEO_BACKBONE_REGISTRY

__all__ = ["ResNet2D", "BasicBlock", "Bottleneck", "RESNET_LAYERS", "TSMResNet", "TSNResNet"]


# depth -> (block type, blocks per stage). Depth 10 is a small network for tests
# and demos; the others are He et al.'s.
RESNET_LAYERS = {
    10: ("basic", (1, 1, 1, 1)),
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)


class _Block(nn.Module):
    """Shared part of the two residual blocks: the shift on the residual branch.

    ``shift_div`` is TSM's fold divisor; 0 means no shift (TSN). The shift is
    applied to the input of the block's first conv only, so the identity path
    carries the unshifted features ("residual shift" in the TSM paper).
    ``shift_impl`` picks the shift's implementation (a key of ``SHIFT_IMPLS``; the
    same values from each).
    """

    expansion = 1

    def __init__(self, shift_div: int, shift_impl: str = "slices"):
        super().__init__()
        self.shift_div = shift_div
        self.shift_impl = shift_impl

    def extra_repr(self) -> str:
        if not self.shift_div:
            return "no shift"
        return f"shift_div={self.shift_div}, shift_impl={self.shift_impl!r}"

    def _branch_input(self, x: torch.Tensor, num_segments: int) -> torch.Tensor:
        if self.shift_div > 0:
            return temporal_shift(x, num_segments, self.shift_div, self.shift_impl)
        return x


class BasicBlock(_Block):
    expansion = 1

    def __init__(
        self, in_ch: int, width: int, stride: int = 1, shift_div: int = 0, shift_impl: str = "slices"
    ):
        super().__init__(shift_div, shift_impl)
        out_ch = width * self.expansion
        self.conv1 = _conv3x3(in_ch, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, out_ch)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_ch, out_ch, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor, num_segments: int) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(self._branch_input(x, num_segments))))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(_Block):
    expansion = 4

    def __init__(
        self, in_ch: int, width: int, stride: int = 1, shift_div: int = 0, shift_impl: str = "slices"
    ):
        super().__init__(shift_div, shift_impl)
        out_ch = width * self.expansion
        self.conv1 = _conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        # Stride on the 3x3 conv, as in torchvision ("ResNet v1.5").
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, out_ch)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_ch, out_ch, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor, num_segments: int) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(self._branch_input(x, num_segments))))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def _downsample(in_ch: int, out_ch: int, stride: int) -> Optional[nn.Sequential]:
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(_conv1x1(in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))


def default_shift_every(depth: int) -> int:
    """TSM shifts in every block up to ResNet-50 and in every other block from
    ResNet-101 on (the deeper networks keep more unshifted features)."""
    return 2 if depth >= 101 else 1


class ResNet2D(nn.Module):
    """A 2D ResNet applied to every frame, with TSM's shift optionally inside.

    Input ``(N, T, 3, H, W)`` (normalized); output ``(N*T, C, H/32, W/32)`` with
    ``C = out_channels``, the frames of each clip consecutive on axis 0.
    """

    def __init__(
        self,
        depth: int = 50,
        width: int = 64,
        shift_div: int = 8,
        shift_every: int = 0,
        zero_init_residual: bool = False,
        shift_impl: str = "slices",
    ):
        """
        Args:
            depth: one of ``RESNET_LAYERS`` (10, 18, 34, 50, 101, 152).
            width: channels of the stem and of the first stage (64 in ResNet);
                smaller values give tiny networks for tests.
            shift_div: TSM's fold divisor (1/shift_div of the channels move each
                way); 0 disables the shift, which makes this TSN's backbone.
            shift_every: shift in blocks ``i`` of each stage with
                ``i % shift_every == 0``; 0 picks :func:`default_shift_every`.
            zero_init_residual: start each block's last BN at gamma = 0, so every
                residual block begins as the identity (helps training from scratch).
            shift_impl: the shift's implementation, a key of
                :data:`~largedet_video.modeling.temporal_shift.SHIFT_IMPLS`.
        """
        super().__init__()
        if depth not in RESNET_LAYERS:
            raise ValueError(f"ResNet depth must be one of {sorted(RESNET_LAYERS)}, got {depth}")
        if shift_impl not in SHIFT_IMPLS:
            raise ValueError(f"shift_impl must be one of {sorted(SHIFT_IMPLS)}, got {shift_impl!r}")
        kind, layers = RESNET_LAYERS[depth]
        block = BasicBlock if kind == "basic" else Bottleneck
        self.depth = depth
        self.shift_div = shift_div
        self.shift_every = shift_every or default_shift_every(depth)
        self.shift_impl = shift_impl

        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = width
        for stage, num_blocks in enumerate(layers):
            stage_width = width * 2**stage
            blocks: List[nn.Module] = []
            for i in range(num_blocks):
                stride = 2 if (i == 0 and stage > 0) else 1
                div = shift_div if i % self.shift_every == 0 else 0
                blocks.append(block(in_ch, stage_width, stride, div, shift_impl))
                in_ch = stage_width * block.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.out_channels = in_ch
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, _Block):
                    nn.init.zeros_(m.last_bn.weight)

    @property
    def stages(self) -> List[nn.Sequential]:
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t = x.shape[:2]
        x = x.flatten(0, 1)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in self.stages:
            for blk in stage:
                x = blk(x, t)
        return x


def _resnet_args(cfg) -> dict:
    v = cfg.MODEL.VIDEO
    return dict(
        depth=v.RESNET.DEPTH,
        width=v.RESNET.WIDTH,
        shift_every=v.TSM.SHIFT_EVERY,
        zero_init_residual=v.RESNET.ZERO_INIT_RESIDUAL,
        shift_impl=v.TSM.SHIFT_IMPL,
    )


@VIDEO_BACKBONE_REGISTRY.register()
def TSMResNet(cfg) -> ResNet2D:
    """ResNet with TSM's residual shift (``MODEL.VIDEO.TSM.SHIFT_DIV``)."""
    return ResNet2D(shift_div=cfg.MODEL.VIDEO.TSM.SHIFT_DIV, **_resnet_args(cfg))


@VIDEO_BACKBONE_REGISTRY.register()
def TSNResNet(cfg) -> ResNet2D:
    """The same ResNet without the shift: TSN's frame-level baseline."""
    return ResNet2D(shift_div=0, **_resnet_args(cfg))
