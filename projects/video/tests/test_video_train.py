"""projects/video/train.py end to end on a tiny config: two gloo processes (DDP
with synchronized BN), started by Detectron2's launch or by torchrun, train and evaluate;
checkpoints, --resume, --eval-only (in this process, through the library's
``train_or_evaluate`` with the ``VideoTrainer``, as the script's main() runs them)."""

import glob
import json
import os
import subprocess
import sys

import pytest
from largedet.engine import largedet_argument_parser, train_or_evaluate

from largedet_video.engine import VideoTrainer, setup

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


def tiny_overrides(spec, output_dir):
    """``KEY VALUE`` arguments of a tiny run on the ``tiny_shapes`` dataset."""
    overrides = {
        "OUTPUT_DIR": output_dir,
        "MODEL.VIDEO.RESNET.DEPTH": 10,
        "MODEL.VIDEO.RESNET.WIDTH": 8,
        "DATASETS.MOVING_SHAPES.NUM_TRAIN": spec.num_train,
        "DATASETS.MOVING_SHAPES.NUM_VAL": spec.num_val,
        "DATASETS.MOVING_SHAPES.NUM_FRAMES": spec.num_frames,
        "DATASETS.MOVING_SHAPES.WIDTH": spec.width,
        "DATASETS.MOVING_SHAPES.HEIGHT": spec.height,
        "DATASETS.MOVING_SHAPES.SEED": spec.seed,
        "INPUT.VIDEO.NUM_FRAMES": 4,
        "INPUT.VIDEO.TRAIN_CROP_SIZE": 32,
        "INPUT.VIDEO.TEST_SHORT_SIDE": 32,
        "INPUT.VIDEO.TEST_CROP_SIZE": 32,
        "INPUT.VIDEO.TEST_NUM_CLIPS": 2,
        "DATALOADER.NUM_WORKERS": 0,
        "SOLVER.IMS_PER_BATCH": 4,
        "SOLVER.MAX_ITER": 2,
        "SOLVER.WARMUP_ITERS": 1,
        "TEST.VIDEOS_PER_BATCH": 2,
    }
    return [str(x) for pair in overrides.items() for x in pair]


def run_train(args, datasets_root, launcher=(), succeeds=True):
    """Run train.py with ``args`` (under ``launcher``, e.g. torchrun's command line), which
    must exit 0 or, with ``succeeds`` False, not; returns its stdout and stderr together."""
    env = dict(os.environ, LARGEDET_DATASETS=datasets_root, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, *launcher, TRAIN_PY, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == succeeds, output[-6000:]
    return output


TORCHRUN_2_CPU = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


def test_two_gloo_processes_train_and_evaluate(tiny_shapes, tiny_shapes_spec, tmp_path):
    out = str(tmp_path / "ddp")
    log = run_train(
        ["--num-gpus", "2", "--dist-url", "auto", *tiny_overrides(tiny_shapes_spec, out)]
        + ["MODEL.VIDEO.NORM", "SyncBN"],
        os.path.dirname(tiny_shapes),
    )
    assert "world size 2; global batch 4 (SOLVER.IMS_PER_BATCH); 2 image(s) per device" in log
    assert "moving_shapes_val: top-1" in log
    assert os.path.isfile(os.path.join(out, "model_final.pth"))
    assert os.path.isfile(os.path.join(out, "log.txt.rank1"))
    assert glob.glob(os.path.join(out, "events.out.tfevents.*"))
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = [json.loads(line) for line in f]
    train_rows = [m for m in metrics if "total_loss" in m]
    assert train_rows and train_rows[-1]["iteration"] == 1
    assert train_rows[-1]["data/skipped_videos"] == 0
    assert any("classification/top1" in m for m in metrics)


def test_torchrun_two_cpu_processes_train_and_evaluate(tiny_shapes, tiny_shapes_spec, tmp_path):
    out = str(tmp_path / "torchrun")
    log = run_train(
        tiny_overrides(tiny_shapes_spec, out), os.path.dirname(tiny_shapes), TORCHRUN_2_CPU
    )
    assert "world size 2; global batch 4 (SOLVER.IMS_PER_BATCH); 2 image(s) per device" in log
    assert log.count("moving_shapes_val: top-1") == 1  # printed by the main process
    assert os.path.isfile(os.path.join(out, "model_final.pth"))
    assert os.path.isfile(os.path.join(out, "log.txt.rank1"))


def test_torchrun_batch_that_does_not_split_is_refused_before_training(
    tiny_shapes, tiny_shapes_spec, tmp_path
):
    # checked against torchrun's WORLD_SIZE (2), not --num-gpus (1), in each process; both
    # stop, the first one says why
    out = str(tmp_path / "refused")
    args = tiny_overrides(tiny_shapes_spec, out) + ["SOLVER.IMS_PER_BATCH", "3"]
    log = run_train(args, os.path.dirname(tiny_shapes), TORCHRUN_2_CPU, succeeds=False)
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: SOLVER.IMS_PER_BATCH 3 is not divisible by the world size 2 (SOLVER.IMS_PER_DEVICE "
        "0: IMS_PER_BATCH / world size images per device); set SOLVER.IMS_PER_DEVICE or change "
        "the number of devices"
    ]
    assert "warning: " not in log  # no process flag was given
    assert "Starting training" not in log and not os.path.exists(out)


@pytest.mark.usefixtures("single_thread")
def test_resume_and_eval_only_in_process(tiny_shapes, tiny_shapes_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("LARGEDET_DATASETS", os.path.dirname(tiny_shapes))
    parser = largedet_argument_parser()
    out = str(tmp_path / "single")
    args = tiny_overrides(tiny_shapes_spec, out) + ["DATALOADER.NUM_WORKERS", "1"]

    def run(flags, overrides):
        parsed = parser.parse_args([*flags, *args, *overrides])
        return train_or_evaluate(VideoTrainer, setup(parsed), parsed)

    assert run([], ["DATASETS.TEST", "()"]) == {}
    with open(os.path.join(out, "last_checkpoint")) as f:
        assert f.read().strip() == "model_final.pth"
    run(["--resume"], ["SOLVER.MAX_ITER", "3", "DATASETS.TEST", "()"])
    with open(os.path.join(out, "log.txt")) as f:
        assert "Starting training from iteration 2" in f.read()
    results = run(["--eval-only"], ["MODEL.WEIGHTS", os.path.join(out, "model_final.pth")])
    top1 = results["classification"]["top1"]
    assert (
        0.0 <= top1 <= 100.0 and results["classification"]["num_videos"] == tiny_shapes_spec.num_val
    )


@pytest.mark.usefixtures("single_thread")
def test_model_ema_is_kept_and_evaluated(tiny_shapes, tiny_shapes_spec, tmp_path, monkeypatch):
    # the video trainer's EMA: updated once per step, in the checkpoint, tested by --eval-only
    import torch

    monkeypatch.setenv("LARGEDET_DATASETS", os.path.dirname(tiny_shapes))
    parser = largedet_argument_parser()
    out = str(tmp_path / "ema")
    args = tiny_overrides(tiny_shapes_spec, out) + ["MODEL_EMA.ENABLED", "True"]

    def run(flags, overrides):
        parsed = parser.parse_args([*flags, *args, *overrides])
        return train_or_evaluate(VideoTrainer, setup(parsed), parsed)

    assert run([], ["DATASETS.TEST", "()"]) == {}
    final = os.path.join(out, "model_final.pth")
    saved = torch.load(final, weights_only=False)
    assert saved["model_ema"]["updates"] == 2
    assert any(not torch.equal(saved["model"][k], v) for k, v in saved["model_ema"]["weights"].items())
    results = run(["--eval-only"], ["MODEL.WEIGHTS", final, "MODEL_EMA.EVAL", "both"])
    assert set(results) == {"classification", "model/classification"}
    assert results["classification"]["num_videos"] == tiny_shapes_spec.num_val


@pytest.mark.usefixtures("single_thread")
def test_preemption_saves_and_resume_matches_an_uninterrupted_run(tiny_shapes, tiny_shapes_spec, tmp_path, monkeypatch):
    import signal

    import torch
    from detectron2.engine import HookBase
    from detectron2.utils.env import seed_all_rng
    from largedet.launch.preemption import Preempted

    class SignalAt(HookBase):
        def before_step(self):
            if self.trainer.iter == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setenv("LARGEDET_DATASETS", os.path.dirname(tiny_shapes))
    parser = largedet_argument_parser()

    def trainer(out, flags=()):
        parsed = parser.parse_args([*flags, *tiny_overrides(tiny_shapes_spec, out), "SOLVER.MAX_ITER", "3",
                                    "DATASETS.TEST", "()", "SEED", "0", "RESEED_EVERY_ITER", "True"])  # fmt: skip
        seed_all_rng(0)
        t = VideoTrainer(setup(parsed))
        t.resume_or_load(resume=parsed.resume)
        return t

    straight = trainer(str(tmp_path / "straight"))
    straight.train()
    first = trainer(str(tmp_path / "preempted"))
    first.register_hooks([SignalAt()])
    with pytest.raises(Preempted) as stop:
        first.train()
    assert stop.value.iteration == 1 and stop.value.checkpoint.endswith("model_0000001.pth")
    resumed = trainer(str(tmp_path / "preempted"), ["--resume"])
    assert resumed.start_iter == 2
    resumed.train()
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
