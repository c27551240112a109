"""Detectron2's own model-zoo LazyConfigs on largedet's LazyConfig path: their ``train`` keys
mapped (those largedet has no use for named in one line and ignored), their warm-up schedule
and global batch read, the same LR at every step as Detectron2's own schedule; and the
capabilities of the yacs path on this one: model EMA, the batch ramp, Weights & Biases."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import largedet  # noqa: F401
import detectron2.data.transforms as T
from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.config import LazyConfig, instantiate
from detectron2.solver import LRMultiplier
from largedet.config.lazy import IGNORED_DETECTRON2_KEYS, ignored_keys, run_config, setup_lazy_config
from largedet.engine.lazy import lazy_trainer
from largedet.solver.lazy import build_lazy_lr_scheduler
from largedet.solver import run_plan

MASK_RCNN = "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.py"


def zoo_path(name):
    return os.path.join(os.path.dirname(model_zoo.__file__), "configs", name)


def zoo_config(name=MASK_RCNN, *overrides):
    path = zoo_path(name)
    if not os.path.isfile(path):
        pytest.skip(f"this Detectron2 has no model-zoo config {name}")
    return LazyConfig.apply_overrides(LazyConfig.load(path), ["train.device=cpu", *overrides])


def test_a_detectron2_model_zoo_config_is_read_as_detectron2_means_it():
    run = run_config(zoo_config())
    solver = run.SOLVER
    assert solver.IMS_PER_BATCH == 16  # dataloader.train.total_batch_size
    assert (solver.MAX_ITER, solver.BASE_LR, solver.OPTIMIZER) == (90000, 0.02, "SGD")
    # lr_multiplier_1x: 1000 linear warm-up steps from 0.001, x0.1 at 60000 and 80000
    assert (solver.WARMUP_ITERS, solver.WARMUP_FACTOR, solver.WARMUP_METHOD) == (1000, 0.001, "linear")
    assert solver.LR_SCHEDULER_NAME == "MultiStepParamScheduler"
    assert tuple(solver.STEPS) == (60000, 80000, 90000)
    assert (solver.CHECKPOINT_PERIOD, run.TEST.EVAL_PERIOD, run.LOG_PERIOD) == (5000, 5000, 20)
    assert (run.DATASETS.TRAIN, run.DATASETS.TEST) == (("coco_2017_train",), ("coco_2017_val",))
    assert run.DATALOADER.NUM_WORKERS == 4 and run.OUTPUT_DIR == "./output"
    block = run_plan(run, 8).describe(run, "SGD")
    assert "global batch 16" in block and "linear warmup over 1000 iterations" in block


def test_detectron2_keys_largedet_does_not_use_are_named_once(tmp_path):
    cfg = zoo_config(MASK_RCNN, f"train.output_dir={tmp_path}")
    assert set(ignored_keys(cfg)) == set(IGNORED_DETECTRON2_KEYS)
    # the script's set-up, in its own process (it sets up the loggers of that process)
    setup = (
        "import argparse\n"
        "from largedet.config.lazy import setup_lazy_config\n"
        f"setup_lazy_config(argparse.Namespace(config_file={zoo_path(MASK_RCNN)!r}, "
        f"opts=['train.device=cpu', 'train.output_dir={tmp_path}'], eval_only=False, resume=False))"
    )
    printed = subprocess.run([sys.executable, "-c", setup], capture_output=True, text=True, check=True)
    lines = [l for l in (printed.stdout + printed.stderr).splitlines() if "largedet does not use" in l]
    assert len(lines) == 1, printed.stdout + printed.stderr
    assert "train.ddp.broadcast_buffers" in lines[0] and "train.checkpointer.max_to_keep" not in lines[0]
    # Detectron2's checkpointer.max_to_keep is SOLVER.CHECKPOINT_MAX_TO_KEEP
    assert run_config(zoo_config(MASK_RCNN)).SOLVER.CHECKPOINT_MAX_TO_KEEP == 100
    assert "largedet does not use" in (tmp_path / "log.txt").read_text()
    # a key of neither kind is still refused
    with pytest.raises(ValueError, match="train.ddp.bucket_cap_mb: not a largedet training key"):
        run_config(zoo_config(MASK_RCNN, "+train.ddp.bucket_cap_mb=25"))


def test_the_lr_of_every_step_is_detectron2s():
    cfg = zoo_config(MASK_RCNN, "train.max_iter=900", "lr_multiplier.scheduler.milestones=[600,800,900]",
                     "lr_multiplier.warmup_length=0.1")  # fmt: skip
    run = run_config(cfg)
    model = nn.Linear(2, 2)
    ours = build_lazy_lr_scheduler(cfg, run, torch.optim.SGD(model.parameters(), lr=0.02), run_plan(run, 8))
    theirs = LRMultiplier(torch.optim.SGD(model.parameters(), lr=0.02),
                          instantiate(cfg.lr_multiplier), max_iter=900)  # fmt: skip
    lrs = []
    for _ in range(900):
        lrs.append((ours.get_last_lr()[0], theirs.get_last_lr()[0]))
        for scheduler in (ours, theirs):
            scheduler.optimizer.step()
            scheduler.step()
    assert [a for a, _ in lrs] == pytest.approx([b for _, b in lrs], rel=1e-12)
    assert lrs[0][0] == pytest.approx(0.02 * 0.001) and lrs[90][0] == pytest.approx(0.02)
    assert lrs[700][0] == pytest.approx(0.002)


def tiny_zoo_config(tmp_path, *overrides):
    """Detectron2's Mask R-CNN R50-FPN config on the tiny shapes set at 64 px, from scratch.
    Its ResNet normalises with BN: the zoo's FrozenBN is an identity on random weights, and 50
    layers of it overflow to Inf in some initialisations (a training step then stops on
    Detectron2's non-finite proposals); the weights are seeded, so every run is the same."""
    torch.manual_seed(0)
    cfg = zoo_config(MASK_RCNN, f"train.output_dir={tmp_path}", "train.init_checkpoint=",
                     "model.backbone.bottom_up.stem.norm=BN", "model.backbone.bottom_up.stages.norm=BN",
                     "dataloader.train.dataset.names=tiny_shapes_train", "dataloader.train.num_workers=0",
                     "model.roi_heads.num_classes=3", "model.backbone.bottom_up.freeze_at=0",
                     "model.roi_heads.batch_size_per_image=16",
                     "+dataloader.train.mapper.instance_mask_format=bitmask", *overrides)  # fmt: skip
    cfg.dataloader.train.mapper.augmentations = [L(T.ResizeShortestEdge)(short_edge_length=64, max_size=64)]
    del cfg.dataloader["test"]
    return cfg


def test_a_detectron2_config_trains_with_ema_and_a_batch_ramp(tiny_shapes, tmp_path):
    # global batch 2 of 1-image micro-batches, 3 steps = 6 images; the ramp trains at batch 1
    # until 0.05 epoch of 24 images (1.2: one step, the stage's last passing its end by less
    # than its batch), then the 5 images left at batch 2: 3 steps, 4 in all
    cfg = tiny_zoo_config(
        tmp_path, "dataloader.train.total_batch_size=2", "+train.ims_per_device=1",
        "train.max_iter=3", "+train.batch_ramp.batches=[1]", "+train.batch_ramp.epochs=[0.05]",
        "+train.model_ema.enabled=True", "+train.model_ema.decay=0.5",
        "+train.model_ema.reference_batch=0", "optimizer.lr=0.0001",
    )  # fmt: skip
    trainer = lazy_trainer(cfg)
    assert trainer.plan.schedule.ramped and trainer.max_iter == 4
    assert [trainer.plan.schedule.batch_at(i) for i in range(4)] == [1, 2, 2, 2]
    assert trainer.ema is not None
    trainer.train()
    model, ema = trainer.model.state_dict(), trainer.ema.state_dict()["weights"]
    assert trainer.ema.state_dict()["updates"] == 4  # once per optimizer step
    shared = [k for k in model if k in ema and model[k].is_floating_point()]
    assert shared and any(not torch.equal(model[k], ema[k]) for k in shared)
    # the LR at batch 1 is the linear rule's half of the LR at batch 2 (no warm-up here: the
    # 1000-step warm-up of the 90000-step schedule rounds to none over 3 steps), and the
    # schedule follows the images: x0.1 from 2/3 of them (60000 / 90000), at step 3 (5 of 6)
    lrs = [lr for lr, _ in trainer.storage.history("lr").values()]
    assert lrs == pytest.approx([5e-5, 1e-4, 1e-4, 1e-5])


def test_wandb_is_a_writer_of_the_lazy_path(tiny_shapes, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # the W&B writer's import fails, naming the key
    trainer = lazy_trainer(tiny_zoo_config(tmp_path, "train.max_iter=1",
                                          "dataloader.train.total_batch_size=1"))  # fmt: skip
    assert trainer.build_writers()  # without W&B: Detectron2's writers
    cfg = tiny_zoo_config(tmp_path, "train.max_iter=1", "dataloader.train.total_batch_size=1",
                          "+train.wandb.enabled=True", "+train.wandb.mode=offline")  # fmt: skip
    assert run_config(cfg).WANDB.ENABLED and run_config(cfg).WANDB.MODE == "offline"
    with pytest.raises(ImportError, match="WANDB.ENABLED"):
        lazy_trainer(cfg).build_writers()
