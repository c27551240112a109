"""End to end: tools/train_net.py trains a tiny detector and evaluates it with COCOEvaluator;
a config that cannot run is one line on stderr before any worker starts."""

import json
import os
import subprocess
import sys

import launch_testing
import numpy as np
import pytest

from largedet.evaluation import evaluate_coco_results

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


def test_train_then_evaluate_through_the_cli(tiny_shapes, tmp_path):
    out_dir = tmp_path / "run"
    overrides = [
        "DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", str(tiny_shapes.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(tiny_shapes.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(tiny_shapes.image_size),
        "DATASETS.SHAPES.SEED", str(tiny_shapes.seed),
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "64",
        "INPUT.MAX_SIZE_TEST", "64", "SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "6",
        "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "(4,)", "SOLVER.CHECKPOINT_PERIOD", "3",
        "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", str(out_dir),
        # seeded: the same 6 steps every run, after which the model finds a few boxes
        "SEED", "0", "RESEED_EVERY_ITER", "True",
    ]
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *overrides],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # training wrote Detectron2's metrics, TensorBoard events and checkpoints
    metrics = [json.loads(line) for line in open(out_dir / "metrics.json")]
    train_rows = [m for m in metrics if "total_loss" in m]
    assert train_rows and all(np.isfinite(m["total_loss"]) for m in train_rows)
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out_dir))
    assert (out_dir / "model_final.pth").is_file()
    assert (out_dir / "last_checkpoint").read_text().strip() == "model_final.pth"

    # the evaluator's AP (full precision in metrics.json, printed to one decimal) is COCO AP of
    # the predictions it wrote; after 6 steps the model finds a few boxes (AP about 0.02%)
    results_file = out_dir / "inference" / "coco_instances_results.json"
    assert len(json.loads(results_file.read_text())) > 0
    recomputed = evaluate_coco_results(tiny_shapes.json_file("val"), str(results_file))
    (evaluated,) = [m for m in metrics if "bbox/AP" in m]
    assert recomputed.ap_percent > 0
    assert evaluated["bbox/AP"] == pytest.approx(recomputed.ap_percent, rel=1e-9)
    assert evaluated["bbox/AP50"] == pytest.approx(100 * recomputed.stats[1], rel=1e-9)
    printed = [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")]
    assert printed == [f"box AP: {recomputed.ap_percent:.1f}"]


def run_rejected(args, tmp_path):
    """Run tools/train_net.py with ``args``; it must stop with one ``error:`` line and exit 2,
    before any worker or model exists, the shapes dataset not generated. Returns that line."""
    env = dict(os.environ, DETECTRON2_DATASETS=str(tmp_path / "d2"), LARGEDET_DATASETS=str(tmp_path / "ld"),
               OMP_NUM_THREADS="1")  # fmt: skip
    return launch_testing.run_rejected(TRAIN_NET, args, env, [tmp_path / "ld"])


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["SOLVER.OPTIMIZER", "Adam"],
         "error: SOLVER.OPTIMIZER: 'Adam' is not registered; registered: AdamW, LAMB, LARS, PMD_LAMB, SGD"),
        (["SOLVER.BASE_LRR", "0.1"], "error: SOLVER.BASE_LRR: no such config key; did you mean SOLVER.BASE_LR?"),
        (["DATASETS.TRAIN", "('shape_train',)"],
         "error: DATASETS.TRAIN: dataset 'shape_train' is not registered; registered names close to it: shapes_train"),
        (["SOLVER.PMD.PERIOD", "-1"], "error: SOLVER.PMD.PERIOD: must be an integer >= 1 (optimizer steps), got -1"),
        # an integer for a float key is taken as that float: the check gets as far as the next error
        (["SOLVER.BASE_LR", "1", "SOLVER.PMD.PERIOD", "0"], "error: SOLVER.PMD.PERIOD: must be an integer >= 1"),
    ],
)  # fmt: skip
def test_config_errors_are_one_line_before_launch(overrides, expected, tmp_path):
    assert run_rejected(["--config", CONFIG, *overrides], tmp_path).startswith(expected)


def test_missing_config_file_and_annotation_file(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    assert run_rejected(["--config", missing], tmp_path) == f"error: {missing}: config file not found"
    line = run_rejected(["--config", CONFIG, "--eval-only", "DATASETS.TEST", "('coco_2017_val',)"], tmp_path)
    json_file = os.path.join(str(tmp_path / "d2"), "coco", "annotations", "instances_val2017.json")
    assert line.startswith(f"error: {json_file}: annotation file of dataset 'coco_2017_val' (DATASETS.TEST) not found")


def test_an_integer_for_a_float_in_a_config_file_names_file_and_key(tmp_path):
    # (merged as it is by every worker, so refused here with what to write)
    base = os.path.abspath(os.path.join(ROOT, "configs", "shapes", "Base-Shapes-R18-FPN.yaml"))
    int_lr = tmp_path / "int_lr.yaml"
    int_lr.write_text(f"_BASE_: {base}\nSOLVER:\n  BASE_LR: 1\n")
    assert run_rejected(["--config", str(int_lr)], tmp_path) == (
        f"error: {int_lr}: SOLVER.BASE_LR: expected a float, got 1; write 1.0"
    )


def test_three_config_mistakes_are_three_lines_in_one_run(tmp_path):
    env = dict(os.environ, LARGEDET_DATASETS=str(tmp_path / "ld"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, TRAIN_NET, "--config", CONFIG, "SOLVER.BASE_LRR", "0.1", "SOLVER.MAX_ITER", "0",
         "SOLVER.PMD.PERIOD", "0"], capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error: ")] == [
        "error: SOLVER.BASE_LRR: no such config key; did you mean SOLVER.BASE_LR?",
        "error: SOLVER.MAX_ITER: must be an integer >= 1, got 0",
        "error: SOLVER.PMD.PERIOD: must be an integer >= 1 (optimizer steps), got 0",
    ]
    assert not (tmp_path / "ld").exists()
