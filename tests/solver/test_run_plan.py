"""The run plan: one function derives a run's numbers from its config, and the trainer, its
loop, its builders, its log block and its run summary all read the one plan it builds."""

import json
import math
import os

import pytest
from engine_testing import largedet_log, tiny_cfg

from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.engine import Trainer
from largedet.solver.batch import BatchArithmeticError
from largedet.solver.plan import ClipWindow, ParameterClip, run_plan


def cfg_of(*opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list(list(opts))
    return cfg


def test_the_plan_holds_the_batch_lr_warmup_and_length():
    cfg = cfg_of(
        "SOLVER.IMS_PER_BATCH", 1056, "SOLVER.IMS_PER_DEVICE", 4, "SOLVER.MAX_ITER", 1500,
        "SOLVER.WARMUP_ITERS", 2000, "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.RULE", "sqrt",
        "SOLVER.LSR.REFERENCE_BATCH", 16, "SOLVER.LSR.REFERENCE_LR", 0.01,
    )  # fmt: skip
    plan = run_plan(cfg, 8, dataset_size=117266)
    assert (plan.batch.global_batch, plan.batch.per_device, plan.batch.accumulation) == (1056, 4, 33)
    assert plan.lr.lr == pytest.approx(0.01 * math.sqrt(1056 / 16), rel=1e-12)
    assert plan.warmup_iters == 1500  # clipped to the run, as Detectron2's schedule does
    assert plan.warmup_images == 1500 * 1056
    assert plan.total_images == plan.images_trained == 1500 * 1056
    assert plan.epochs == pytest.approx(1500 * 1056 / 117266)
    assert [plan.accumulation_at(t) for t in (0, 1499)] == [33, 33]
    assert plan.clip_at(0) is None and plan.describe_clipping() is None


def test_the_clip_windows_are_on_the_image_clock_of_a_ramp():
    # ramp: batch 4 for the first epoch of 16 images, then 8; warm-up 2 steps of 8 = 16 images
    cfg = cfg_of(
        "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 6,
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.BATCH_RAMP.BATCHES", (4,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,),
        "SOLVER.WARMUP_CLIP.MAX_NORM", 3.0, "SOLVER.WARMUP_CLIP.ITERS", (1, 1),
        "SOLVER.AGVM.ENABLED", True, "SOLVER.AGVM.CLIP_MAX_NORM", 2.0, "SOLVER.AGVM.CLIP_ITERS", (0, 1),
    )  # fmt: skip
    plan = run_plan(cfg, 1, dataset_size=16)
    # steps 0-3 at batch 4 (clock 0, 0.5, 1, 1.5), then batch 8 (clock 2, 3, 4, 5)
    assert [plan.clock(t) for t in range(8)] == [0, 0.5, 1, 1.5, 2, 3, 4, 5]
    assert [plan.accumulation_at(t) for t in (0, 3, 4)] == [2, 2, 4]
    assert plan.clip_windows == (
        ClipWindow("SOLVER.WARMUP_CLIP", 3.0, 1, 3),
        ClipWindow("SOLVER.AGVM.CLIP_MAX_NORM", 2.0, 2, 3),
    )
    assert [plan.clip_at(t) for t in range(6)] == [None, None, 3.0, 3.0, 2.0, None]
    # the LR of a ramp step: the rule's ratio of its batch to the full batch (linear here)
    assert (plan.lr_factor(4), plan.lr_factor(8)) == (0.5, 1.0)
    assert plan.images_trained == 48 and plan.total_steps == 8


def test_detectron2_clip_gradients_become_the_plans_rules():
    full = run_plan(cfg_of("SOLVER.CLIP_GRADIENTS.ENABLED", True, "SOLVER.CLIP_GRADIENTS.CLIP_TYPE",
                           "full_model", "SOLVER.CLIP_GRADIENTS.CLIP_VALUE", 5.0), 1)  # fmt: skip
    assert full.clip_windows == (ClipWindow("SOLVER.CLIP_GRADIENTS", 5.0, 0, math.inf),)
    assert full.clip_at(0) == full.clip_at(10**9) == 5.0
    assert "total norm <= 5 at every step (SOLVER.CLIP_GRADIENTS)" in full.describe_clipping()
    value = run_plan(cfg_of("SOLVER.CLIP_GRADIENTS.ENABLED", True), 1)  # Detectron2's default: value 1.0
    assert value.parameter_clip == ParameterClip("value", 1.0, 2.0) and value.clip_windows == ()
    with pytest.raises(ValueError, match="SOLVER.CLIP_GRADIENTS.NORM_TYPE must be 2.0"):
        run_plan(cfg_of("SOLVER.CLIP_GRADIENTS.ENABLED", True, "SOLVER.CLIP_GRADIENTS.CLIP_TYPE",
                        "full_model", "SOLVER.CLIP_GRADIENTS.NORM_TYPE", 1.0), 1)  # fmt: skip
    with pytest.raises(ValueError, match="SOLVER.CLIP_GRADIENTS.CLIP_TYPE must be one of"):
        run_plan(cfg_of("SOLVER.CLIP_GRADIENTS.ENABLED", True, "SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "l2"), 1)


def test_bad_batch_arithmetic_and_agvm_without_two_estimates_stop_the_plan():
    with pytest.raises(BatchArithmeticError, match="SOLVER.IMS_PER_BATCH 10"):
        run_plan(cfg_of("SOLVER.IMS_PER_BATCH", 10, "SOLVER.IMS_PER_DEVICE", 4), 1)
    with pytest.raises(ValueError, match="two independent gradient estimates"):
        run_plan(cfg_of("SOLVER.IMS_PER_BATCH", 4, "SOLVER.AGVM.ENABLED", True), 1)
    with pytest.raises(ValueError, match="training set's size"):
        run_plan(cfg_of("SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2,
                        "SOLVER.BATCH_RAMP.BATCHES", (4,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,)), 1)  # fmt: skip


def _trainer_numbers(tmp_path, caplog, batch):
    out = str(tmp_path / f"bs{batch}")
    cfg = tiny_cfg(
        out, "SOLVER.IMS_PER_BATCH", batch, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 1,
        "SOLVER.WARMUP_ITERS", 3, "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.REFERENCE_BATCH", 2,
        "SOLVER.LSR.REFERENCE_LR", 0.01,
    )  # fmt: skip
    caplog.clear()
    with largedet_log(caplog):
        trainer = Trainer(cfg)
        trainer.train()
    block = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Large-batch run:"))
    with open(os.path.join(out, "run_summary.json")) as f:
        summary = json.load(f)
    return trainer, block, summary


def test_changing_the_batch_in_the_config_changes_every_number_that_derives_from_it(tiny_shapes, tmp_path, caplog):
    """IMS_PER_BATCH is set in one place; the LR, K, the warm-up in images, the optimizer's
    and the schedule's LR, the loop's K, the log block and the run summary all follow."""
    seen = {}
    for batch in (4, 8):
        trainer, block, summary = _trainer_numbers(tmp_path, caplog, batch)
        k, lr = batch // 2, 0.01 * batch / 2
        assert trainer.plan.batch.accumulation == trainer.loop.accumulation_steps == k
        assert trainer.plan.lr.lr == pytest.approx(lr, rel=1e-12)
        assert trainer.scheduler.base_lrs[0] == pytest.approx(lr, rel=1e-12)
        assert f"{k} accumulation step(s)" in block and f"LR {lr:g} = linear scaling rule" in block
        assert f"warmup over 1 iterations ({batch} images)" in block
        assert f"1 iterations x {batch} = {batch} images = {batch / 24:.2f} epochs of 24 images" in block
        assert summary["batch"]["accumulation"] == k and summary["lr"]["peak"] == pytest.approx(lr)
        assert summary["warmup_images"] == batch and summary["epochs"] == pytest.approx(batch / 24)
        seen[batch] = block
    assert seen[4] != seen[8]
