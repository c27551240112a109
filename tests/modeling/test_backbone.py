"""largedet.modeling: basic-block ResNets of any width under Detectron2's FPN."""

import pytest
import torch

import largedet.engine  # noqa: F401  (registers the backbones)
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_backbone
from largedet.config import add_largedet_config
from largedet.modeling import basic_resnet


def cfg_with(**resnets):
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_basic_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    cfg.MODEL.RESNETS.NORM = "BN"
    for key, value in resnets.items():
        setattr(cfg.MODEL.RESNETS, key, value)
    return cfg


@pytest.mark.parametrize("depth, blocks", [(10, 1), (18, 2)])
def test_narrow_fpn_shapes_widths_and_depth(depth, blocks):
    cfg = cfg_with(DEPTH=depth, STEM_OUT_CHANNELS=16, RES2_OUT_CHANNELS=16)
    backbone = build_backbone(cfg, ShapeSpec(channels=3))
    out = backbone(torch.zeros(2, 3, 64, 64))
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "p2": (2, 32, 16, 16), "p3": (2, 32, 8, 8), "p4": (2, 32, 4, 4),
        "p5": (2, 32, 2, 2), "p6": (2, 32, 1, 1),
    }  # fmt: skip
    resnet = backbone.bottom_up
    assert [resnet.output_shape()[f"res{i}"].channels for i in (2, 3, 4, 5)] == [16, 32, 64, 128]
    assert len(resnet.res2) == blocks and len(resnet.res5) == blocks
    # 3x3 convs: stem 7x7 3->16; block i: two 3x3 convs (+ 1x1 shortcut when the width changes)
    expected = 7 * 7 * 3 * 16
    c_in = 16
    for c in (16, 32, 64, 128):
        expected += 9 * c_in * c + 9 * c * c + (c_in * c if c_in != c else 0)
        expected += (blocks - 1) * 2 * 9 * c * c
        c_in = c
    convs = sum(m.weight.numel() for m in resnet.modules() if isinstance(m, torch.nn.Conv2d))
    assert convs == expected


def test_bad_depth_and_width_name_the_key():
    with pytest.raises(ValueError, match="MODEL.RESNETS.DEPTH must be one of \\[10, 18, 34\\]"):
        basic_resnet(
            in_channels=3,
            depth=50,
            stem_channels=8,
            res2_channels=8,
            norm="BN",
            out_features=["res5"],
        )
    with pytest.raises(ValueError, match="MODEL.RESNETS.RES2_OUT_CHANNELS must be >= 1"):
        basic_resnet(
            in_channels=3,
            depth=10,
            stem_channels=8,
            res2_channels=0,
            norm="BN",
            out_features=["res5"],
        )
