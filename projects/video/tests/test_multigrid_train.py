"""Multigrid in the video trainer: the plan in optimizer steps and its LR, stage
changes in place (same model object, optimizer state kept, BN regrouped), precise
BN before evaluations, resume mid-schedule, and two gloo processes."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from detectron2.engine import HookBase
from detectron2.engine.hooks import PreciseBN
from largedet.engine import largedet_argument_parser

from largedet_video.data import MovingShapesSpec, prepare_moving_shapes
from largedet_video.engine import VideoTrainer, build_multigrid_lr_scheduler, multigrid_run_plan, setup
from largedet_video.engine.multigrid import precise_bn_steps
from largedet_video.engine.stage_times import read_stage_times
from largedet_video.layers import SubBatchNorm2d
from largedet_video.multigrid import MultigridParamScheduler, MultigridPlan
from largedet_video.multigrid import build_multigrid_schedule

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


def long_cycle_plan(accumulation=1):
    # B=2, T=4, S=32, long cycle only, base LR stages [0, 4), [4, 6): stages
    # 16x1x23 epochs [0, 4), 8x2x23 [4, 6), 4x2x32 [6, 7), 2x4x32 [7, 8), fine-tuning
    # 2x4x32 [8, 9). On 16 clips: 1, 1, 1, 1, 2, 2, 4, 8, 8 batches per epoch.
    schedule = build_multigrid_schedule(2, 4, 32, [0, 4], 6, short_cycle=False)
    return MultigridPlan.create(schedule, 16, accumulation=accumulation)


def test_plan_in_optimizer_steps():
    plan = long_cycle_plan()
    assert plan.epoch_batches == (1, 1, 1, 1, 2, 2, 4, 8, 8)
    assert plan.max_iter == 28
    assert plan.lr_milestones() == [(0, 8.0), (4, 4.0), (8, 2.0), (12, 1.0), (20, 0.1)]
    assert [end for _, end in plan.stage_end_iterations()] == [4, 8, 12, 20, 28]
    assert plan.position_of_iteration(5) == (4, 1) and plan.position_of_iteration(8) == (6, 0)
    assert plan.stage_at_iteration(19).index == 3 and plan.stage_at_iteration(20).fine_tuning
    # Two batches per step: batches 0..27 in 14 steps; a step takes the LR of the
    # epoch of its first batch: epochs 4, 6, 7, 8 start at batches 4, 8, 12, 20.
    plan2 = long_cycle_plan(accumulation=2)
    assert plan2.max_iter == 14
    assert plan2.lr_milestones() == [(0, 8.0), (2, 4.0), (4, 2.0), (6, 1.0), (10, 0.1)]
    assert [end for _, end in plan2.stage_end_iterations()] == [2, 4, 6, 10, 14]
    # step 1: batches 2 and 3, the only batches of epochs 2 and 3 (16x1x23); step 2: batches
    # 4 and 5, epoch 4's two (8x2x23), the first starting it
    assert [(str(s), first) for s, first in plan2.shapes_of_iteration(1)] == [("16x1x23", True)] * 2
    assert [(str(s), first) for s, first in plan2.shapes_of_iteration(2)] == [("8x2x23", True), ("8x2x23", False)]


def test_one_lr_scheduler_with_warmup(tmp_path):
    from detectron2.config import get_cfg
    from largedet.solver import run_plan

    from largedet_video import add_video_config

    plan = long_cycle_plan()
    cfg = add_video_config(get_cfg())
    cfg.SOLVER.WARMUP_ITERS, cfg.SOLVER.WARMUP_FACTOR = 2, 0.5
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    video_plan = multigrid_run_plan(run_plan(cfg, 1), cfg, plan)
    assert video_plan.multigrid is plan and video_plan.warmup_iters == 2
    scheduler = build_multigrid_lr_scheduler(cfg, optimizer, video_plan)
    lrs = []
    for _ in range(plan.max_iter):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # Warmup from 0.5 x 0.8 to 0.8 over 2 steps, then 0.8, 0.4, 0.2, 0.1, 0.01.
    expected = [0.4, 0.6] + [0.8] * 2 + [0.4] * 4 + [0.2] * 4 + [0.1] * 8 + [0.01] * 8
    assert lrs == pytest.approx(expected)
    where = [i / plan.max_iter for i in range(plan.max_iter)]
    assert [MultigridParamScheduler.from_plan(plan)(w) for w in where][3:5] == [8.0, 4.0]


# --- the trainer -----------------------------------------------------------------

SPEC = MovingShapesSpec(num_train=64, num_val=4, num_frames=12, width=48, height=32, seed=5)


@pytest.fixture(scope="module", autouse=True)
def restore_loggers():
    """The video set-up (``largedet_video.engine.setup``) gives these loggers handlers and
    stops their propagation; put them back so that later tests' log capture works."""
    names = ["detectron2", "fvcore", "largedet", "largedet_video"]
    saved = {
        n: (logging.getLogger(n).propagate, list(logging.getLogger(n).handlers)) for n in names
    }
    yield
    for name, (propagate, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.propagate = propagate
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("datasets_mg"))
    prepare_moving_shapes(SPEC, root)
    return root


def overrides(output_dir, **extra):
    # Base: 2 clips x 4 frames x 32^2, 64 clips = 32 steps per epoch; 192 steps with a
    # step at 128 = LR stages [0, 4), [4, 6) epochs. Multigrid, both cycles: 9 epochs.
    values = {
        "OUTPUT_DIR": output_dir,
        "MODEL.VIDEO.RESNET.DEPTH": 10,
        "MODEL.VIDEO.RESNET.WIDTH": 8,
        "DATASETS.MOVING_SHAPES.NUM_TRAIN": SPEC.num_train,
        "DATASETS.MOVING_SHAPES.NUM_VAL": SPEC.num_val,
        "DATASETS.MOVING_SHAPES.NUM_FRAMES": SPEC.num_frames,
        "DATASETS.MOVING_SHAPES.WIDTH": SPEC.width,
        "DATASETS.MOVING_SHAPES.HEIGHT": SPEC.height,
        "DATASETS.MOVING_SHAPES.SEED": SPEC.seed,
        "DATASETS.TEST": "()",
        "INPUT.VIDEO.NUM_FRAMES": 4,
        "INPUT.VIDEO.TRAIN_CROP_SIZE": 32,
        "INPUT.VIDEO.TEST_SHORT_SIDE": 32,
        "INPUT.VIDEO.TEST_CROP_SIZE": 32,
        "INPUT.VIDEO.TEST_NUM_CLIPS": 1,
        "INPUT.VIDEO.TEST_NUM_CROPS": 1,
        "DATALOADER.NUM_WORKERS": 0,
        "SOLVER.OPTIMIZER": "SGD",
        "SOLVER.MOMENTUM": 0.9,
        "SOLVER.BASE_LR": 0.01,
        "SOLVER.IMS_PER_BATCH": 2,
        "SOLVER.LR_SCHEDULER_NAME": "WarmupMultiStepLR",
        "SOLVER.STEPS": "(128,)",
        "SOLVER.MAX_ITER": 192,
        "SOLVER.WARMUP_ITERS": 0,
        "SOLVER.CHECKPOINT_PERIOD": 10,
        # off: multigrid recomputes BN at the base shape after every stage all the same
        "TEST.PRECISE_BN.ENABLED": False,
        "TEST.PRECISE_BN.NUM_ITER": 1,
        "MULTIGRID.LONG_CYCLE": True,
        "MULTIGRID.SHORT_CYCLE": True,
        "MULTIGRID.BN_BASE_SIZE": 8,
    }
    values.update(extra)
    return [str(x) for pair in values.items() for x in pair]


class Recorder(HookBase):
    """Per step: the model object, the first parameter before the step, its gradient and
    the optimizer's momentum buffer of it after the step, the LR, and (from a forward hook)
    the batch's shape and labels and the BN grouping it was normalized with."""

    def __init__(self):
        self.steps = []
        self._batch = None

    def before_train(self):
        self.model = self.trainer.model
        self.model.register_forward_hook(self._see_batch)

    def _see_batch(self, module, inputs, output):
        # The step's training batch (precise BN's batches come after it).
        if module.training and self._batch is None:
            bn = next(m for m in module.modules() if isinstance(m, SubBatchNorm2d))
            self._batch = (inputs[0]["clip"].shape, inputs[0]["label"].tolist(), bn.num_splits)

    def before_step(self):
        self._batch = None
        self.lr = self.trainer.optimizer.param_groups[0]["lr"]
        self.param_before = self.trainer.optimizer.param_groups[0]["params"][0].detach().clone()

    def after_step(self):
        optimizer = self.trainer.optimizer
        param = optimizer.param_groups[0]["params"][0]
        self.steps.append(
            {
                "iter": self.trainer.iter,
                "model": self.trainer.model,
                "param_before": self.param_before,
                "grad": param.grad.clone(),
                "momentum": optimizer.state[param].get("momentum_buffer"),
                "momentum_value": optimizer.state[param]["momentum_buffer"].clone(),
                "lr": self.lr,
                "shape": tuple(self._batch[0]),
                "labels": self._batch[1],
                "bn_splits": self._batch[2],
            }
        )


def train(output_dir, resume=False, **extra):
    args = largedet_argument_parser().parse_args(overrides(output_dir, **extra))
    cfg = setup(args)
    trainer = VideoTrainer(cfg)
    recorder = Recorder()
    trainer.register_hooks([recorder])
    trainer.resume_or_load(resume=resume)
    trainer.train()
    return trainer, recorder.steps


@pytest.fixture(scope="module")
def uninterrupted(datasets_root, tmp_path_factory):
    os.environ["LARGEDET_DATASETS"] = datasets_root
    torch.set_num_threads(1)
    counts = {"precise_bn": 0}
    original = PreciseBN.update_stats

    def counting(self):
        counts["precise_bn"] += 1
        return original(self)

    PreciseBN.update_stats = counting
    try:
        out = str(tmp_path_factory.mktemp("mg_run"))
        trainer, steps = train(out)
    finally:
        PreciseBN.update_stats = original
    return out, trainer, steps, counts["precise_bn"]


def test_stage_changes_in_place(uninterrupted):
    _, trainer, steps, precise_bn_runs = uninterrupted
    plan = trainer.multigrid
    # 64 clips, B=2: stage 0 cycles 32x1x16, 16x1x23, 16x1x23 (3 batches per epoch,
    # 3 epochs), ... 59 steps; the LR changes at the stage starts only.
    assert plan.epoch_batches == (3, 3, 3, 6, 6, 6, 6, 13, 13) and trainer.max_iter == 59
    assert plan.lr_milestones() == [(0, 8.0), (9, 4.0), (21, 2.0), (33, 1.0), (46, 0.1)]
    assert len(steps) == 59
    assert [s["shape"][:2] for s in steps[:4]] == [(32, 1), (16, 1), (16, 1), (32, 1)]
    assert steps[0]["shape"][3:] == (16, 16) and steps[1]["shape"][3:] == (23, 23)
    for s in steps:
        epoch, batch = plan.position_of_iteration(s["iter"])
        shape = plan.schedule.stage_at(epoch).short_cycle_shapes[batch % 3]
        assert s["shape"] == (
            shape.batch_size,
            shape.num_frames,
            3,
            shape.crop_size,
            shape.crop_size,
        )
        assert s["bn_splits"] == max(shape.batch_size // 8, 1)
        lr = [v for it, v in plan.lr_milestones() if it <= s["iter"]][-1]
        assert s["lr"] == pytest.approx(0.01 * lr)
    # One model object and one momentum buffer per parameter all along, carried over
    # each stage change (not reset).
    assert all(s["model"] is steps[0]["model"] for s in steps)
    assert trainer.model is steps[0]["model"]
    group = trainer.optimizer.param_groups[0]
    assert (group["momentum"], group["dampening"], group["nesterov"]) == (0.9, 0, False)
    for _, end in plan.stage_end_iterations()[:-1]:
        before, after = steps[end - 1], steps[end]
        assert after["momentum"] is before["momentum"]
        # torch's SGD: buf = 0.9 buf + (grad + weight_decay x param), from the stage's
        # last buffer: a buffer reset at the stage change would give the bracket alone.
        d_p = after["grad"] + group["weight_decay"] * after["param_before"]
        expected = 0.9 * before["momentum_value"] + d_p
        assert torch.allclose(after["momentum_value"], expected, rtol=1e-5, atol=1e-7)
        assert not torch.allclose(d_p, expected, rtol=1e-3, atol=1e-6)  # the old buffer counts
    # Precise BN once, after the last step (no periodic evaluation), though
    # TEST.PRECISE_BN.ENABLED is False: the shapes' mixed statistics never reach a test;
    # not at the other stage ends, where nothing reads the statistics.
    assert [s.index for s, _ in plan.stage_end_iterations()] == [0, 1, 2, 4]
    assert precise_bn_runs == 1
    assert (trainer.multigrid_hook.precise_bn_passes, trainer.stage_times is not None) == (1, True)


def test_stage_times_of_the_run(uninterrupted):
    out, trainer, steps, _ = uninterrupted
    (summary,) = read_stage_times(out)
    plan = trainer.multigrid
    by_shape = {}
    for s in steps:
        (shape, _), = plan.shapes_of_iteration(s["iter"])
        by_shape[str(shape)] = by_shape.get(str(shape), 0) + 1
    assert {k: v["steps"] for k, v in summary["steps"].items()} == by_shape
    assert sum(by_shape.values()) == 59
    # one batch per step: every epoch's first batch starts a step of its own
    assert summary["epoch_starts"] == len(plan.epoch_batches) == 9
    assert summary["precise_bn_passes"] == 1 and summary["precise_bn_s"] > 0
    for key, v in summary["steps"].items():
        b, t, crop = (int(x) for x in key.split("x"))
        assert v["voxels"] == b * t * crop * crop
    parts = summary["step_s"] + summary["precise_bn_s"] + summary["evaluation_s"] + summary["other_s"]
    assert parts == pytest.approx(summary["wall_s"], abs=2e-3)


def test_precise_bn_steps():
    # Detectron2's EvalHook evaluates after steps 10 and 20 of 28 and at the end; 14
    # divides 28: its last periodic evaluation is the final one
    assert precise_bn_steps(28, 10) == [10, 20, 28]
    assert precise_bn_steps(28, 14) == [14, 28]
    assert precise_bn_steps(28, 0) == [28]
    assert precise_bn_steps(28, 100) == [28]


def test_resume_mid_schedule(uninterrupted, tmp_path):
    out, trainer, steps, _ = uninterrupted
    resumed_dir = str(tmp_path / "resumed")
    shutil.copytree(out, resumed_dir)
    # A run stopped after its checkpoint at 10 steps: stage 1 (epochs 3-5), epoch 3, batch 1
    # of its short cycle (the later checkpoints removed: --resume takes the newest complete one).
    for name in os.listdir(resumed_dir):
        if name.endswith(".pth") and name != "model_0000009.pth":
            os.remove(os.path.join(resumed_dir, name))
    with open(os.path.join(resumed_dir, "last_checkpoint"), "w") as f:
        f.write("model_0000009.pth")
    resumed, resumed_steps = train(resumed_dir, resume=True)
    assert resumed.start_iter == 10
    assert resumed.multigrid.position_of_iteration(10) == (3, 1)
    assert [s["iter"] for s in resumed_steps] == list(range(10, 59))
    for a, b in zip(steps[10:], resumed_steps):
        assert (a["shape"], a["labels"]) == (b["shape"], b["labels"])
        assert a["lr"] == pytest.approx(b["lr"])
    assert resumed_steps[0]["shape"][:2] == (8, 2)  # stage 1's 16x2x16 cycle, position 1


def test_two_gloo_processes(datasets_root, tmp_path):
    out = str(tmp_path / "ddp")
    env = dict(os.environ, LARGEDET_DATASETS=datasets_root, OMP_NUM_THREADS="1")
    # 1 clip per device: BN groups of 8 clips span both processes (synchronized).
    args = overrides(out, **{"SOLVER.MAX_ITER": 96, "SOLVER.STEPS": "(64,)"})
    proc = subprocess.run(
        [sys.executable, TRAIN_PY, "--num-gpus", "2", "--dist-url", "auto", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # the start-of-run block gives the multigrid plan's schedule, not SOLVER's 96 steps
    assert "\n  Multigrid (long cycle on, short cycle on): base shape 1x4x32 per device" in log
    assert "Large-batch run:" in log and "96 iterations x" not in log
    assert "\n  no warmup\n  Multigrid (long cycle on" in log  # SOLVER.WARMUP_ITERS 0
    # 32 clips per device and epoch, 4 epochs: stages 0, 1 and 3 (2 and the
    # fine-tuning stage round to zero epochs), 25 steps.
    assert "Multigrid stage 3 from step 12 (epoch 3, batch 0): 4x4x16, 2x4x23, 1x4x32" in log
    with open(os.path.join(out, "metrics.json")) as f:
        rows = [json.loads(line) for line in f]
    assert rows[-1]["iteration"] == 24 and rows[-1]["multigrid/stage"] == 3
    assert os.path.isfile(os.path.join(out, "model_final.pth"))


@pytest.mark.parametrize("workers", [0, 1])
def test_precise_bn_reads_the_training_loaders_decoded_videos(datasets_root, tmp_path, workers):
    """With the training loader in this process (no workers), multigrid's precise-BN
    loader reads the training dataset's decoded-video cache (one object: no video decoded
    twice); with loader workers, each keeps its own and precise BN its own too."""
    os.environ["LARGEDET_DATASETS"] = datasets_root
    args = largedet_argument_parser().parse_args(overrides(
        str(tmp_path), **{"INPUT.VIDEO.DECODED_CACHE_MB": 8, "DATALOADER.NUM_WORKERS": workers}))
    trainer = VideoTrainer(setup(args))
    train_cache = trainer.data_loader.dataset.cache
    bn_cache = trainer.multigrid_hook._precise_bn._data_loader.dataset.cache
    assert train_cache is not None and bn_cache is not None
    assert (bn_cache is train_cache) == (workers == 0)
    # a base-shape batch through precise BN's loader fills the shared cache (or its own)
    next(iter(trainer.multigrid_hook._precise_bn._data_loader))
    assert len(bn_cache) > 0 and (len(train_cache) > 0) == (workers == 0)
