"""Every yaml under projects/video/configs loads and builds its model."""

import glob
import os

import pytest
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from largedet.engine import batch_plan
from largedet.solver import lr_scaling

from largedet_video import add_video_config

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.yaml")))


def load(path):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.merge_from_file(path)
    return cfg


def test_there_are_configs():
    names = {os.path.basename(p) for p in CONFIGS}
    assert {
        "Base-Video.yaml",
        "kinetics400_tsm_r50_8f.yaml",
        "tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml",
    } <= names


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_loads_and_builds(path):
    cfg = load(path)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.VIDEO.PRETRAINED = ""  # a local file on the cluster
    model = build_model(cfg)
    assert model.head.fc.out_features == cfg.MODEL.VIDEO.NUM_CLASSES
    assert cfg.SOLVER.MAX_ITER > cfg.SOLVER.WARMUP_ITERS


def test_kinetics_recipe_arithmetic():
    cfg = load(os.path.join(CONFIG_DIR, "kinetics400_tsm_r50_8f.yaml"))
    s = cfg.SOLVER
    iters_per_epoch = 240_000 / s.IMS_PER_BATCH
    assert s.IMS_PER_BATCH == 1536 * 8
    assert s.MAX_ITER == int(100 * iters_per_epoch)
    assert s.WARMUP_ITERS == round(5 * iters_per_epoch)
    assert lr_scaling(cfg).lr == pytest.approx(0.01 * s.IMS_PER_BATCH / 64) == pytest.approx(1.92)
    assert batch_plan(cfg, 1536).accumulation == 1 and batch_plan(cfg, 8).accumulation == 192
    assert s.LR_SCHEDULER_NAME == "WarmupCosineLR"
    assert (s.WEIGHT_DECAY, s.WEIGHT_DECAY_NORM, s.WEIGHT_DECAY_BIAS) == (1e-4, 0.0, 0.0)
    assert cfg.MODEL.VIDEO.DROPOUT == 0.0 and cfg.INPUT.VIDEO.NUM_FRAMES == 8
    assert cfg.MODEL.VIDEO.RESNET.DEPTH == 50 and cfg.MODEL.VIDEO.BACKBONE == "TSMResNet"
