"""benchmarks/trainer_overhead.py on tiny sizes: both trainers train in alternating rounds and
the script prints their step times and the ratio."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "trainer_overhead.py")


def test_alternating_rounds_and_the_ratio(tiny_shapes):
    opts = [
        "DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", tiny_shapes.num_train,
        "DATASETS.SHAPES.NUM_VAL", tiny_shapes.num_val, "DATASETS.SHAPES.IMAGE_SIZE", tiny_shapes.image_size,
        "DATASETS.SHAPES.SEED", tiny_shapes.seed, "DATASETS.SHAPES.HOLDOUT_SEED", -1,
        "INPUT.MIN_SIZE_TRAIN", "(32,)", "INPUT.MAX_SIZE_TRAIN", 32, "SOLVER.IMS_PER_BATCH", 2,
        "DATALOADER.NUM_WORKERS", 0,
    ]  # fmt: skip
    cmd = [sys.executable, SCRIPT, "--rounds", "2", "--iters", "2", "--warmup-rounds", "1"]
    cmd += ["--verbose", *map(str, opts)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rounds = re.findall(r"^round (\d) (\w+): [\d.]+ s/step", proc.stdout, re.M)
    assert rounds == [
        ("0", "detectron2"), ("0", "largedet"),
        ("1", "largedet"), ("1", "detectron2"),
        ("2", "detectron2"), ("2", "largedet"),
    ]  # fmt: skip
    assert "2 rounds of 2 steps per trainer after 1 warm-up round(s), alternating" in proc.stdout
    for name, cls in (("detectron2", "DefaultTrainer"), ("largedet", "Trainer")):
        assert re.search(rf"^  {name} +\S+\.{cls}: median [\d.]+ s/step", proc.stdout, re.M)
    ratio = re.search(r"largedet / detectron2: ([\d.]+) \(medians\), ([\d.]+)", proc.stdout)
    assert ratio and float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0
