"""AGVM's parameter groups: model parts by module-name prefix, combined with the weight-decay
and trust-ratio splits, for every optimizer of the registry; build_agvm from the config."""

import pytest
import torch
from torch import nn

from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.optim import AGVM, PART_KEY
from largedet.solver.plan import ClipWindow, run_plan
from largedet.solver import build_agvm, build_optimizer, model_parts

# Detectron2's GeneralizedRCNN naming, in miniature
RCNN_GROUPS = [
    ("backbone", "backbone.bottom_up"),
    ("fpn", "backbone"),
    ("rpn", "proposal_generator"),
    ("box_head", "roi_heads.box_"),
]


class MiniRCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.ModuleDict(
            {
                "bottom_up": nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)),
                "fpn_lateral2": nn.Conv2d(4, 4, 1),
            }
        )
        self.proposal_generator = nn.Conv2d(4, 2, 1)
        self.roi_heads = nn.ModuleDict(
            {"box_head": nn.Linear(4, 4), "box_predictor": nn.Linear(4, 3)}
        )
        self.backbone["bottom_up"][0].requires_grad_(False)  # a frozen stem: in no part


def agvm_cfg(optimizer="SGD", *opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list(
        [
            "SOLVER.OPTIMIZER",
            optimizer,
            "SOLVER.AGVM.ENABLED",
            True,
            "SOLVER.AGVM.GROUPS",
            RCNN_GROUPS,
        ]
        + list(opts)
    )
    return cfg


def test_the_longest_prefix_wins_and_frozen_parameters_have_no_part():
    model = MiniRCNN()
    parts = {n: model_parts(model, RCNN_GROUPS).get(p) for n, p in model.named_parameters()}
    assert parts == {
        "backbone.bottom_up.0.weight": None,
        "backbone.bottom_up.0.bias": None,
        "backbone.bottom_up.1.weight": "backbone",
        "backbone.bottom_up.1.bias": "backbone",
        "backbone.fpn_lateral2.weight": "fpn",
        "backbone.fpn_lateral2.bias": "fpn",
        "proposal_generator.weight": "rpn",
        "proposal_generator.bias": "rpn",
        "roi_heads.box_head.weight": "box_head",
        "roi_heads.box_head.bias": "box_head",
        "roi_heads.box_predictor.weight": "box_head",
        "roi_heads.box_predictor.bias": "box_head",
    }


def test_a_parameter_outside_every_part_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"SOLVER.AGVM.GROUPS .* proposal_generator.weight, "):
        model_parts(MiniRCNN(), RCNN_GROUPS[:2] + RCNN_GROUPS[3:])


@pytest.mark.parametrize("name", ["SGD", "AdamW", "LAMB", "PMD_LAMB", "LARS"])
def test_every_optimizer_gets_part_named_groups_with_its_usual_splits(name):
    model = MiniRCNN()
    optimizer = build_optimizer(agvm_cfg(name, "SOLVER.WEIGHT_DECAY", 0.01), model)
    names = {p: n for n, p in model.named_parameters()}
    expected = model_parts(model, RCNN_GROUPS)
    seen = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert group[PART_KEY] == expected[p], names[p]
            # the usual splits inside each part: no weight decay for biases and BN
            decayed = not (names[p].endswith("bias") or names[p].startswith("backbone.bottom_up.1"))
            assert group["weight_decay"] == (0.01 if decayed else 0.0), names[p]
            if name in ("LAMB", "PMD_LAMB", "LARS"):
                assert group["adapt"] == decayed, names[p]
            seen.add(p)
    assert seen == set(expected)
    # a part owns several groups (decayed weights, biases)
    assert sum(g[PART_KEY] == "fpn" for g in optimizer.param_groups) == 2
    agvm = build_agvm(agvm_cfg(name), optimizer)
    assert set(agvm.parts) == {"backbone", "fpn", "rpn", "box_head"}


def test_disabled_agvm_leaves_the_groups_as_they_were():
    model = MiniRCNN()
    cfg = add_largedet_config(get_cfg())
    cfg.SOLVER.AGVM.GROUPS = RCNN_GROUPS
    optimizer = build_optimizer(cfg, model)
    assert all(PART_KEY not in g for g in optimizer.param_groups)
    assert build_agvm(cfg, optimizer) is None


def test_build_agvm_reads_the_config():
    cfg = agvm_cfg(
        "SGD",
        "SOLVER.WARMUP_ITERS", 30, "SOLVER.AGVM.PERIOD", 5, "SOLVER.AGVM.CLAMP", (0.25, 4.0),
        "SOLVER.AGVM.MOMENTUM", 0.9, "SOLVER.AGVM.REFERENCE", "fpn",
        "SOLVER.AGVM.CLIP_MAX_NORM", 2.0, "SOLVER.AGVM.CLIP_ITERS", (10, 20),
    )  # fmt: skip
    agvm = build_agvm(cfg, build_optimizer(cfg, MiniRCNN()))
    assert isinstance(agvm, AGVM)
    assert (agvm.period, agvm.start_iter, agvm.clamp, agvm.momentum, agvm.reference) == (
        5, 30, (0.25, 4.0), 0.9, "fpn"
    )  # fmt: skip
    # its clip is the run plan's window: from 10 steps before to 20 after the end of warm-up
    cfg.SOLVER.IMS_PER_DEVICE = 8  # two micro-batches per step: AGVM's two estimates
    assert run_plan(cfg, 1).clip_windows == (ClipWindow("SOLVER.AGVM.CLIP_MAX_NORM", 2.0, 20, 50),)
    cfg.SOLVER.AGVM.START_ITER = 0
    assert build_agvm(cfg, build_optimizer(cfg, MiniRCNN())).start_iter == 0


def test_detectron2_default_groups_cover_generalized_rcnn():
    from detectron2.modeling import build_model

    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.META_ARCHITECTURE = "GeneralizedRCNN"
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.OUT_CHANNELS = 16
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 1
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 16
    cfg.MODEL.MASK_ON = True
    cfg.MODEL.ROI_MASK_HEAD.CONV_DIM = 8
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    model = build_model(cfg)
    parts = set(model_parts(model, cfg.SOLVER.AGVM.GROUPS).values())
    assert parts == {"backbone", "fpn", "rpn", "box_head", "mask_head"}
