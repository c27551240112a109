"""Every yaml under configs/ loads into largedet's config, and its numbers add up."""

import glob
import os
import re

import pytest

from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.solver.batch import batch_plan
from largedet.solver import lr_scaling

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "configs")
CONFIGS = sorted(
    os.path.relpath(p, CONFIG_DIR)
    for p in glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True)
)


def load(name):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(CONFIG_DIR, name))
    return cfg


def test_configs_are_found():
    assert "r50_fpn_bs1056.yaml" in CONFIGS and "shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml" in CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_and_its_batch_and_schedule_are_consistent(name):
    cfg = load(name)
    solver = cfg.SOLVER
    # the global batch splits into whole micro-batches on one device, and on as many
    # devices as give one micro-batch per step
    single = batch_plan(cfg, 1)
    assert single.global_batch == solver.IMS_PER_BATCH
    if solver.IMS_PER_DEVICE:
        devices = solver.IMS_PER_BATCH // solver.IMS_PER_DEVICE
        assert batch_plan(cfg, devices).accumulation == 1
    assert lr_scaling(cfg).lr > 0
    steps = list(solver.STEPS)
    assert steps == sorted(steps) and all(0 < s < solver.MAX_ITER for s in steps)
    assert 0 <= solver.WARMUP_ITERS < solver.MAX_ITER
    assert solver.CHECKPOINT_PERIOD > 0


# (config, global batch, devices, accumulation steps on them, peak LR, images trained)
EXPECTED = [
    ("r50_fpn_bs16_sgd.yaml", 16, 8, 1, 0.02, 90000 * 16),
    ("r50_fpn_bs256_sgd_lsr.yaml", 256, 8, 4, 0.32, 5625 * 256),
    ("r50_fpn_bs1056.yaml", 1056, 8, 33, 0.0008 * (1056 / 16) ** 0.5, 1910 * 1056),
    ("r50_fpn_bs1056_agvm.yaml", 1056, 8, 33, 0.0008 * (1056 / 16) ** 0.5, 1910 * 1056),
    ("mask_rcnn_r50_fpn_bs1056.yaml", 1056, 132, 2, 0.0008 * (1056 / 16) ** 0.5, 1910 * 1056),
    ("shapes/faster_rcnn_R18_FPN_pmdlamb_bs64.yaml", 64, 1, 8, 0.02, 125 * 64),
    ("shapes/faster_rcnn_R18_FPN_syncbn_sgd_bs16_lsr.yaml", 16, 2, 2, 0.04, 300 * 16),
]


@pytest.mark.parametrize("name, batch, devices, accumulation, lr, images", EXPECTED)
def test_large_batch_configs(name, batch, devices, accumulation, lr, images):
    cfg = load(name)
    plan = batch_plan(cfg, devices)
    assert (plan.global_batch, plan.accumulation) == (batch, accumulation)
    assert lr_scaling(cfg).lr == pytest.approx(lr, rel=1e-12)
    assert cfg.SOLVER.MAX_ITER * cfg.SOLVER.IMS_PER_BATCH == images
    if cfg.DATASETS.TRAIN == ("coco_2017_train",):
        # the 1x schedule's 1,440,000 images at every batch, to within one step; 1.4x that
        # (the regime grid's 1.4x) at 1056, the batch the study's recipe is for
        epochs = 1.4 if batch == 1056 else 1.0
        assert abs(images - epochs * 90000 * 16) < cfg.SOLVER.IMS_PER_BATCH


def test_bs1056_configs_use_the_three_ingredients():
    for name in ("r50_fpn_bs1056.yaml", "mask_rcnn_r50_fpn_bs1056.yaml"):
        cfg = load(name)
        assert (
            cfg.SOLVER.OPTIMIZER == "PMD_LAMB"
            and cfg.SOLVER.LSR.ENABLED
            and cfg.SOLVER.WARMUP_ITERS > 0
        )
        assert cfg.MODEL.RESNETS.NORM == "SyncBN" and cfg.MODEL.FPN.NORM == "SyncBN"
    assert (
        load("mask_rcnn_r50_fpn_bs1056.yaml").MODEL.MASK_ON
        and not load("r50_fpn_bs1056.yaml").MODEL.MASK_ON
    )


def test_the_agvm_config_is_the_bs1056_config_with_agvm_on():
    base, agvm = load("r50_fpn_bs1056.yaml"), load("r50_fpn_bs1056_agvm.yaml")
    assert agvm.SOLVER.AGVM.ENABLED and not base.SOLVER.AGVM.ENABLED
    for cfg in (base, agvm):
        cfg.SOLVER.AGVM.ENABLED = False
        cfg.OUTPUT_DIR = ""
    assert agvm == base


# the large-batch configs that carry the large-batch study's recipe, with the LR each had
# before (kept at its batch; the study sets the rule, not the value)
# and the epoch factor of its schedule (the COCO 1056 configs take the regime grid's 1.4x)
RECIPE_CONFIGS = [
    ("r50_fpn_bs1056.yaml", 6.6e-3, 1.4),
    ("r50_fpn_bs1056_agvm.yaml", 6.6e-3, 1.4),
    ("mask_rcnn_r50_fpn_bs1056.yaml", 6.6e-3, 1.4),
    ("openimages_r50_fpn_bs640.yaml", 4e-3, 1.0),
]


@pytest.mark.parametrize("name, earlier_lr, epochs", RECIPE_CONFIGS)
def test_large_batch_configs_carry_the_study_recipe(name, earlier_lr, epochs):
    cfg = load(name)
    solver = cfg.SOLVER
    assert solver.OPTIMIZER == "PMD_LAMB" and solver.PMD.DECAY == "cosine"
    assert solver.LSR.ENABLED and solver.LSR.RULE == "sqrt"
    assert lr_scaling(cfg).lr == pytest.approx(earlier_lr, rel=0.02)
    # warm-up 20% of the 1.0x run (its steps kept at 1.4x, as the study's 1.4x rows kept
    # theirs), the period a quarter of the run (to the nearest step)
    assert abs(solver.WARMUP_ITERS - 0.2 * solver.MAX_ITER / epochs) <= 0.5
    assert abs(solver.PMD.PERIOD - solver.MAX_ITER / 4) <= 0.5
    # every study row the YAML's comments name is a row of its grid's CSV: "regime: <cell>"
    # of the regime grid's, any other of the steps-matched grid's
    with open(os.path.join(CONFIG_DIR, name)) as f:
        text = f.read()
    cell = r"((?:sgd|lamb|pmd_lamb|adamw)-bs\d+[\w.-]*\w)"
    regime = set(re.findall(r"regime: " + cell, text))
    steps = set(re.findall(r"(?<!regime: )\b" + cell, text))
    for rows, grid in ((regime, "batch_scaling_regime.csv"), (steps, "batch_scaling_steps.csv")):
        with open(os.path.join(CONFIG_DIR, "..", "study", "results", grid)) as f:
            cells = {line.split(",", 1)[0] for line in f}
        assert rows <= cells, (grid, rows - cells)


@pytest.mark.parametrize("name", ["r50_fpn_bs1056.yaml", "r50_fpn_bs1056_agvm.yaml", "mask_rcnn_r50_fpn_bs1056.yaml"])
def test_coco_batch_1056_configs_take_the_study_schedule_and_weight_decay(name):
    from largedet.solver.lr_scheduler import lr_multiplier

    cfg = load(name)
    solver = cfg.SOLVER
    # the regime grid's row pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01: warm-up-stable-decay from 80%
    # of the run, weight decay 0.01, 1.4x the epochs; the step schedule's milestones are gone
    assert solver.LR_SCHEDULER_NAME == "WarmupStableDecayLR" and solver.WSD.DECAY_START == 0.8
    assert solver.WEIGHT_DECAY == 0.01 and tuple(solver.STEPS) == ()
    # the study's own config of that row says the same
    study = load("shapes/study/faster_rcnn_R10w16_FPN_64px_pmdlamb_bs1024.yaml")
    assert (study.SOLVER.LR_SCHEDULER_NAME, study.SOLVER.WSD.DECAY_START, study.SOLVER.WEIGHT_DECAY) == (
        solver.LR_SCHEDULER_NAME, solver.WSD.DECAY_START, solver.WEIGHT_DECAY)
    # the LR the run follows: the 1x schedule's 20% warm-up (273 steps), the peak to 80% of
    # the run (step 1,528), then linear to 0 at 1,910: 1.4x the 1x schedule's 1,364 steps
    # (1,440,000 images / 1056), rounded as the study's grid rounds its 1.4x
    from largedet.solver import run_plan

    peak = lr_scaling(cfg).lr
    shape = lr_multiplier(cfg, run_plan(cfg, solver.IMS_PER_BATCH // max(solver.IMS_PER_DEVICE, 1)))
    at = lambda step: shape(step / solver.MAX_ITER)  # noqa: E731
    assert (solver.MAX_ITER, solver.WARMUP_ITERS, solver.PMD.PERIOD) == (1910, 273, 478)
    assert solver.MAX_ITER == round(1.4 * round(90000 * 16 / 1056))
    assert at(273) == pytest.approx(1.0) and at(1528) == pytest.approx(1.0)
    assert at(1719) == pytest.approx(0.5, abs=1e-9) and at(1910) == pytest.approx(solver.BASE_LR_END / peak)
