"""projects/video/train.py end to end on a tiny config: two gloo processes (DDP
with synchronized BN) train and evaluate; checkpoints, --resume, --eval-only
(in this process, through the script's main())."""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from largedet.engine import largedet_argument_parser

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


def run_train(args, datasets_root):
    env = dict(os.environ, LARGEDET_DATASETS=datasets_root, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, TRAIN_PY, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


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


def load_train_script():
    spec = importlib.util.spec_from_file_location("video_train_script", TRAIN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("single_thread")
def test_resume_and_eval_only_in_process(tiny_shapes, tiny_shapes_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("LARGEDET_DATASETS", os.path.dirname(tiny_shapes))
    script = load_train_script()
    parser = largedet_argument_parser()
    out = str(tmp_path / "single")
    args = tiny_overrides(tiny_shapes_spec, out) + ["DATALOADER.NUM_WORKERS", "1"]

    def run(flags, overrides):
        return script.main(parser.parse_args([*flags, *args, *overrides]))

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
