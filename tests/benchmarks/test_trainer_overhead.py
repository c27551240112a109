"""benchmarks/trainer_overhead.py on tiny sizes: both trainers train in alternating rounds at
two batch sizes on generated COCO-size JPEGs, and the script prints their images/s, the ratios
and the same figures as one line of JSON."""

import json
import os
import re
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "trainer_overhead.py")


def test_alternating_rounds_and_the_ratio():
    opts = [
        "MODEL.ROI_HEADS.NUM_CLASSES", 80, "INPUT.MIN_SIZE_TRAIN", "(32,)", "INPUT.MAX_SIZE_TRAIN", 48,
        "DATALOADER.NUM_WORKERS", 0, "SEED", 0,
    ]  # fmt: skip
    cmd = [sys.executable, SCRIPT, "--rounds", "2", "--iters", "1", "--warmup-rounds", "1"]
    cmd += ["--ims-per-batch", "1", "2", "--coco-images", "4", "--verbose", *map(str, opts)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rounds = re.findall(r"^IMS_PER_BATCH (\d), round (\d), (\w+): ([\d.]+) s/step", proc.stdout, re.M)
    order = [("0", "detectron2"), ("0", "largedet"), ("1", "largedet"), ("1", "detectron2"),
             ("2", "detectron2"), ("2", "largedet")]  # fmt: skip
    assert [r[:3] for r in rounds] == [("1", *o) for o in order] + [("2", *o) for o in order]
    assert "4 COCO-size JPEGs: 2 rounds of 1 steps per trainer after 1 warm-up round(s), alternating" in proc.stdout
    for name, cls in (("detectron2", "DefaultTrainer"), ("largedet", "Trainer")):
        assert len(re.findall(rf"^  {name} +\S+\.{cls}: median [\d.]+ s/step, [\d.]+ images/s", proc.stdout, re.M)) == 2

    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("GPU-CHECK-FIGURES ")
    figures = json.loads(last[len("GPU-CHECK-FIGURES "):])
    assert figures["ims_per_batch"] == [1, 2] and figures["timed_out"] is False and figures["workers"] == 0
    for b in (1, 2):
        assert figures[f"rounds_b{b}"] == 2
        # the printed step times, as images/s: the medians and the per-round ratios
        step = {name: [float(r[3]) for r in rounds if r[0] == str(b) and r[1] != "0" and r[2] == name]
                for name in ("detectron2", "largedet")}  # fmt: skip
        ips = {name: [b / s for s in steps] for name, steps in step.items()}
        for name in ips:
            assert figures[f"{name}_images_per_s_b{b}"] == pytest.approx(statistics.median(ips[name]), rel=2e-3)
            assert figures[f"{name}_images_per_s_range_b{b}"] == pytest.approx([min(ips[name]), max(ips[name])], rel=2e-3)
        assert figures[f"ratio_b{b}"] == pytest.approx(
            figures[f"largedet_images_per_s_b{b}"] / figures[f"detectron2_images_per_s_b{b}"], rel=2e-3
        )
        ratios = [ours / ref for ours, ref in zip(ips["largedet"], ips["detectron2"])]
        assert figures[f"round_ratio_median_b{b}"] == pytest.approx(statistics.median(ratios), rel=2e-3)
    assert figures["ratio_min"] == min(figures["ratio_b1"], figures["ratio_b2"])


def test_the_time_limit_still_prints_the_figures():
    cmd = [sys.executable, SCRIPT, "--rounds", "1", "--iters", "1", "--max-seconds", "0.001"]
    cmd += ["DATASETS.SHAPES.NUM_TRAIN", "4", "DATALOADER.NUM_WORKERS", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    figures = json.loads(last[len("GPU-CHECK-FIGURES "):])
    assert figures["timed_out"] is True and figures["ratio_min"] is None
