"""End to end: tools/train_net.py trains a tiny detector and evaluates it with COCOEvaluator."""

import json
import os
import subprocess
import sys

import numpy as np

from largedet.evaluation import evaluate_coco_results

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


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
    ]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", CONFIG, *overrides],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # training wrote Detectron2's metrics, TensorBoard events and checkpoints
    metrics = [json.loads(line) for line in open(out_dir / "metrics.json")]
    train_rows = [m for m in metrics if "total_loss" in m]
    assert train_rows and all(np.isfinite(m["total_loss"]) for m in train_rows)
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out_dir))
    assert (out_dir / "model_final.pth").is_file()
    assert (out_dir / "last_checkpoint").read_text().strip() == "model_final.pth"

    # the printed box AP is COCO AP of the predictions the COCOEvaluator wrote
    results_file = out_dir / "inference" / "coco_instances_results.json"
    printed = [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")]
    assert len(printed) == 1
    if results_file.exists():
        recomputed = evaluate_coco_results(tiny_shapes.json_file("val"), str(results_file)).ap_percent
        assert printed[0] == f"box AP: {recomputed:.1f}"
    else:  # an untrained model may predict nothing; Detectron2 then reports AP 0
        assert printed[0] == "box AP: 0.0"
