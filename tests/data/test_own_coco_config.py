"""The starting config for one's own COCO data (configs/own_coco/faster_rcnn_R18_FPN_sgd_bs8.yaml)
trains on a generated 2-class dataset whose category ids are 3 and 7, on one CPU core, to a
nonzero AP; only the data, the image size and the length are overridden."""

import os
import subprocess
import sys

from largedet.data import ShapesSpec, generate_shapes
from own_data_testing import own_data_opts

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "own_coco", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


def test_the_starting_config_trains_a_users_two_classes_to_a_nonzero_ap(tmp_path):
    spec = ShapesSpec(num_train=96, num_val=16, image_size=64, seed=5, root=str(tmp_path / "shapes"))
    generate_shapes(spec)
    out_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, TRAIN_NET, "--config", CONFIG, *own_data_opts(spec, str(tmp_path)),
         "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "64",
         "INPUT.MAX_SIZE_TEST", "64", "SOLVER.MAX_ITER", "150", "SOLVER.WARMUP_ITERS", "30",
         "DATALOADER.NUM_WORKERS", "0", "MODEL.DEVICE", "cpu", "OUTPUT_DIR", str(out_dir)],
        capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ap = [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")]
    assert len(ap) == 1 and float(ap[0].split(": ")[1]) > 0, proc.stdout[-2000:]
    log = (out_dir / "log.txt").read_text()
    assert "apple" in log and "pear" in log  # the per-class AP table names the user's classes
    assert "\x1b[" not in log  # no colour codes in the log file
