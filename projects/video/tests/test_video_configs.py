"""Every yaml under projects/video/configs loads and builds its model."""

import glob
import math
import os

import pytest
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from largedet.solver.batch import batch_plan
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
    assert s.PMD.PERIOD == s.MAX_ITER // 4
    # the square-root rule from 0.01 per 16 clips (the next test: the study's choice)
    assert lr_scaling(cfg).lr == pytest.approx(0.01 * math.sqrt(s.IMS_PER_BATCH / 16)) == pytest.approx(0.2771, abs=1e-4)
    assert batch_plan(cfg, 1536).accumulation == 1 and batch_plan(cfg, 8).accumulation == 192
    assert s.LR_SCHEDULER_NAME == "WarmupCosineLR"
    assert (s.WEIGHT_DECAY, s.WEIGHT_DECAY_NORM, s.WEIGHT_DECAY_BIAS) == (1e-4, 0.0, 0.0)
    assert cfg.MODEL.VIDEO.DROPOUT == 0.0 and cfg.INPUT.VIDEO.NUM_FRAMES == 8
    assert cfg.MODEL.VIDEO.RESNET.DEPTH == 50 and cfg.MODEL.VIDEO.BACKBONE == "TSMResNet"
    # the paper's SGD recipe is the overrides the config's comment gives
    sgd = load(os.path.join(CONFIG_DIR, "kinetics400_tsm_r50_8f.yaml"))
    sgd.defrost()
    sgd.merge_from_list(["SOLVER.OPTIMIZER", "SGD", "SOLVER.LSR.RULE", "linear", "SOLVER.LSR.REFERENCE_BATCH", "64"])
    assert lr_scaling(sgd).lr == pytest.approx(1.92)


def test_multigrid_configs_plan():
    from largedet_video.multigrid import build_multigrid_plan, multigrid_enabled

    # Kinetics: LR steps at 1172 and 1660 of 1953 steps of 12288 clips = epochs 60, 85
    # of 100; 150 multigrid epochs in 416 steps on 1536 devices.
    cfg = load(os.path.join(CONFIG_DIR, "kinetics400_tsm_r50_8f_multigrid.yaml"))
    assert multigrid_enabled(cfg) and cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupMultiStepLR"
    plan = build_multigrid_plan(cfg, 240_000, 1536)
    assert plan.schedule.max_epoch == 150 and plan.max_iter == 416
    assert plan.schedule.base_shape.batch_size == 8 and plan.accumulation == 1
    # The demo: 800 steps of 16 clips = 16 epochs of 800 -> 24 epochs in 230 steps.
    cfg = load(os.path.join(CONFIG_DIR, "tsm_r18w32_8f_moving_shapes_multigrid_adamw_bs16.yaml"))
    plan = build_multigrid_plan(cfg, 800, 1)
    assert (plan.schedule.max_epoch, plan.max_iter, plan.base_max_iter) == (24, 230, 800)
    base = load(os.path.join(CONFIG_DIR, "tsm_r18w32_8f_moving_shapes_adamw_steps_bs16.yaml"))
    assert not multigrid_enabled(base)


def test_kinetics_config_cites_study_rows_that_exist_and_takes_the_marked_recipe():
    """Every study row the Kinetics config's comments name ("video4k: <cell>") is a row of the
    tsm4k study's CSV; the row marked as the config's recipe (the held-out choice, generated)
    is what the config trains: its optimizer, its warm-up in epochs (5 where the name says
    none), its schedule (cosine, or WSD for ``-lrwsd``) and its LR factor on the linear rule."""
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(CONFIG_DIR)))
    path = os.path.join(CONFIG_DIR, "kinetics400_tsm_r50_8f.yaml")
    with open(path) as f:
        text = f.read()
    with open(os.path.join(root, "study/results/video/tsm4k_study.csv")) as f:
        rows = {line.split(",", 1)[0] for line in f}
    cell = r"((?:sgd|pmd_lamb)-bs\d+[\w.-]*)"
    cited = set(re.findall(r"video4k: " + cell, text))
    assert cited and cited <= rows, cited - rows
    (recipe,) = re.findall(r"\[video4k: " + cell + r", n=\d+\].*<- this config's recipe", text)
    cfg = load(path)
    s = cfg.SOLVER
    iters_per_epoch = 240_000 / s.IMS_PER_BATCH
    warmup = re.search(r"-wu([\d.]+)", recipe)
    lr_factor = float(re.search(r"-lrx([\d.]+)", recipe).group(1)) if "-lrx" in recipe else 1.0
    optimizer = recipe.split("-")[0]
    assert s.OPTIMIZER == {"sgd": "SGD", "pmd_lamb": "PMD_LAMB"}[optimizer]
    assert s.WARMUP_ITERS == round(float(warmup.group(1) if warmup else 5) * iters_per_epoch)
    assert s.LR_SCHEDULER_NAME == ("WarmupStableDecayLR" if "-lrwsd" in recipe else "WarmupCosineLR")
    # the study's rule and reference LR per 16 clips times the row's factor (PMD-LAMB: the
    # square-root rule from 0.005); SGD keeps the paper's linear rule from 0.01 per 64 clips
    if optimizer == "pmd_lamb":
        assert (s.LSR.RULE, s.LSR.REFERENCE_BATCH) == ("sqrt", 16)
        assert s.LSR.REFERENCE_LR == pytest.approx(0.005 * lr_factor)
    else:
        assert (s.LSR.RULE, s.LSR.REFERENCE_BATCH) == ("linear", 64)
        assert s.LSR.REFERENCE_LR == pytest.approx(0.01 * lr_factor)
