"""The Trainer on real Detectron2 detectors: equal to DefaultTrainer at K = 1, the LR it
applies, its start-of-run log block, and exact resume."""

import logging
import os

import pytest
import torch
from engine_testing import straight_and_killed, tiny_cfg, weights

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.engine import DefaultTrainer, HookBase
from detectron2.utils.env import seed_all_rng
from largedet.config import add_largedet_config
from largedet.engine import Trainer
from largedet.engine.parts import TrainerParts
from largedet.solver.plan import with_run_length

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def shapes_rcnn_cfg(output_dir, *opts):
    """The shapes Faster R-CNN R18-FPN with a narrow box head, on tiny_shapes resized to 32 px,
    CPU, single process."""
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(CONFIGS, "shapes", "Base-Shapes-R18-FPN.yaml"))
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", "cpu",
            "MODEL.ROI_BOX_HEAD.FC_DIM", "64",
            "DATASETS.TRAIN", "('tiny_shapes_train',)", "DATASETS.TEST", "()",
            "INPUT.MIN_SIZE_TRAIN", "(32,)", "INPUT.MAX_SIZE_TRAIN", "32",
            "DATALOADER.NUM_WORKERS", "0",
            "SOLVER.BASE_LR", "0.01", "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "()",
            "SOLVER.CHECKPOINT_PERIOD", "1000",
            "OUTPUT_DIR", str(output_dir),
        ]
        + [str(o) for o in opts]
    )  # fmt: skip
    cfg.freeze()
    return cfg


class RecordLR(HookBase):
    """The LR of the first parameter group during each iteration."""

    def __init__(self):
        self.lrs = []

    def before_step(self):
        self.lrs.append(self.trainer.optimizer.param_groups[0]["lr"])


class CocoFreeTrainer(DefaultTrainer):
    """Plain Detectron2 (no test datasets are configured)."""


def test_k1_without_lsr_trains_exactly_like_detectron2(tiny_shapes, tmp_path):
    opts = ["SOLVER.IMS_PER_BATCH", 2, "SOLVER.MAX_ITER", 2, "SOLVER.FOREACH", False]
    results = {}
    for name, cls in (("detectron2", CocoFreeTrainer), ("largedet", Trainer)):
        seed_all_rng(0)
        trainer = cls(shapes_rcnn_cfg(tmp_path / name, *opts))
        trainer.resume_or_load(resume=False)
        trainer.train()
        results[name] = weights(trainer.model)
    reference, ours = results["detectron2"], results["largedet"]
    assert reference.keys() == ours.keys()
    changed = [k for k in ours if not torch.equal(ours[k], reference[k])]
    assert changed == []


def test_lsr_and_warmup_reach_the_optimizer_through_the_lr_hook(tiny_shapes, tmp_path, caplog):
    cfg = tiny_cfg(
        str(tmp_path),
        "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 5,
        "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.REFERENCE_BATCH", 2, "SOLVER.LSR.REFERENCE_LR", 0.01,
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.5, "SOLVER.STEPS", (4,),
    )  # fmt: skip
    trainer = _with_log_capture(caplog, lambda: Trainer(cfg))
    record = RecordLR()
    trainer.register_hooks([record])
    trainer.train()
    # peak 0.01 x 8 / 2 = 0.04; warmup 0.5 then 0.75 of it; x0.1 from iteration 4
    assert record.lrs == pytest.approx([0.02, 0.03, 0.04, 0.04, 0.004], rel=1e-12)
    assert trainer.plan.batch.accumulation == 4
    assert trainer.iter == 5 and trainer.data.position == 5 * 8
    block = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Large-batch run")]
    assert len(block) == 1
    text = block[0]
    for fragment in (
        "world size 1; global batch 8 (SOLVER.IMS_PER_BATCH); 2 image(s) per device per pass; "
        "4 accumulation step(s)",
        "LR 0.04 = linear scaling rule: reference LR 0.01 at batch 2 x 8 / 2",
        "linear warmup over 2 iterations (16 images) from 0.5 x LR = 0.02",
        "5 iterations x 8 = 40 images = 1.67 epochs of 24 images",
        "optimizer SGD",
    ):
        assert fragment in text


def _with_log_capture(caplog, fn):
    """Run ``fn`` with largedet's log records in ``caplog`` (its logger does not propagate
    once set up)."""
    logger = logging.getLogger("largedet")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False  # each record reaches caplog's handler once, set up or not
    try:
        with caplog.at_level(logging.INFO, logger="largedet"):
            return fn()
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def test_resume_after_a_kill_reaches_the_same_weights(tiny_shapes, tmp_path):
    # Faster R-CNN with BN and random proposal sampling, PMD-LAMB inside a period (T = 3),
    # 2 micro-batches of 2 images per step, warmup and an LR step: 4 steps straight, or
    # killed before iteration 3 (last checkpoint after iteration 1) and resumed.
    opts = [
        "SOLVER.OPTIMIZER", "PMD_LAMB", "SOLVER.PMD.PERIOD", 3, "SOLVER.BASE_LR", 0.002,
        "SOLVER.IMS_PER_BATCH", 4, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 4,
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.STEPS", "(3,)", "SOLVER.CHECKPOINT_PERIOD", 2,
        "RESEED_EVERY_ITER", True,
    ]  # fmt: skip
    straight, resumed, _ = straight_and_killed(
        lambda out: shapes_rcnn_cfg(out, *opts), tmp_path, stop_at=3, last_checkpoint="model_0000001.pth"
    )
    assert resumed.start_iter == 2 and resumed.data.position == 2 * 4
    assert resumed.data.seed == straight.data.seed
    resumed.train()

    final, reference = weights(resumed.model), weights(straight.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []
    assert (
        resumed.optimizer.state_dict()["state"].keys()
        == straight.optimizer.state_dict()["state"].keys()
    )
    for key, state in straight.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(
                torch.as_tensor(resumed.optimizer.state_dict()["state"][key][name]),
                torch.as_tensor(value),
            )


@pytest.mark.parametrize("period, logged", [(1, [0, 1, 2, 3, 4]), (2, [1, 3, 4]), (20, [4])])
def test_log_period_sets_how_often_metrics_are_written(tiny_shapes, tmp_path, period, logged):
    import json

    from engine_testing import tiny_cfg

    cfg = tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 5, "LOG_PERIOD", period)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    with open(tmp_path / "metrics.json") as f:
        iterations = [json.loads(line)["iteration"] for line in f]
    assert iterations == logged  # every `period` steps, and the last


def test_log_period_must_be_positive(tiny_shapes, tmp_path):
    from engine_testing import tiny_cfg

    # the trainer checks its config against each key's declared rule, as the scripts do
    with pytest.raises(ValueError, match="LOG_PERIOD: must be an integer >= 1, got 0"):
        Trainer(tiny_cfg(str(tmp_path), "LOG_PERIOD", 0))


def test_reference_world_size_is_refused_by_the_trainer(tiny_shapes, tmp_path):
    from engine_testing import tiny_cfg

    with pytest.raises(ValueError, match="SOLVER.REFERENCE_WORLD_SIZE: must be 0 .SOLVER.IMS_PER_BATCH is the global batch"):
        Trainer(tiny_cfg(str(tmp_path), "SOLVER.REFERENCE_WORLD_SIZE", 8))


class ThreeStepParts(TrainerParts):
    """A run whose length is not SOLVER.MAX_ITER (as the video project's multigrid plan)."""

    def build_run_plan(self, cfg, data_loader):
        return with_run_length(super().build_run_plan(cfg, data_loader), cfg, 3)


def test_run_length_sets_the_loop_the_schedule_and_the_writers(tiny_shapes, tmp_path, monkeypatch):
    from detectron2.engine.hooks import PeriodicWriter
    from detectron2.utils.events import CommonMetricPrinter
    from engine_testing import tiny_cfg

    from largedet.engine.writers import StopOnFullDiskJSONWriter, StopOnFullDiskTensorboardXWriter
    from largedet.engine.writers import EarlyPeriodicWriter, WandbWriter

    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_cfg(
        str(tmp_path), "SOLVER.MAX_ITER", 10, "SOLVER.WARMUP_ITERS", 0,
        "SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR", "WANDB.ENABLED", True, "WANDB.MODE", "offline",
    )  # fmt: skip
    trainer = Trainer(cfg, parts=ThreeStepParts(Trainer))
    (writer_hook,) = [h for h in trainer._hooks if isinstance(h, PeriodicWriter)]
    assert isinstance(writer_hook, EarlyPeriodicWriter)  # the first progress line after step 3
    writers = writer_hook._writers
    assert [type(w) for w in writers] == [
        CommonMetricPrinter, StopOnFullDiskJSONWriter, StopOnFullDiskTensorboardXWriter, WandbWriter
    ]  # fmt: skip
    assert trainer.max_iter == 3 and writers[0]._max_iter == 3  # the ETA counts 3 steps
    record = RecordLR()
    trainer.register_hooks([record])
    trainer.train()
    # cosine over the run's 3 steps from 0.1: 0.1 x (1 + cos(pi i / 3)) / 2 (over MAX_ITER's
    # 10 it would be 0.1, 0.0976, 0.0905)
    assert record.lrs == pytest.approx([0.1, 0.075, 0.025], rel=1e-12)
    assert trainer.iter == 3
