"""benchmarks/loader_speed.py on tiny sizes: the figures agree with each other (images counted
as asked, rates as images over seconds, per worker as the rate over the workers, the workers
a GPU needs), and the COCO-size JPEGs it loads are photo-sized and match their annotations."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from detectron2.data.datasets import load_coco_json
from PIL import Image

from synthetic_coco import write_synthetic_coco

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "loader_speed.py")


def test_the_figures_agree():
    cmd = [sys.executable, SCRIPT, "--images", "6", "--workers", "0", "1", "--ims-per-batch", "2"]
    cmd += ["--images-per-worker", "3", "--warmup-images-per-worker", "2", "--single-images", "3"]
    cmd += ["--train-images-per-s", "2.5", "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("GPU-CHECK-FIGURES ")
    f = json.loads(last[len("GPU-CHECK-FIGURES "):])

    assert f["workers"] == [0, 1] and f["timed_out"] is False
    assert (f["images"], f["ims_per_batch"], f["min_size_train"], f["max_size_train"]) == (6, 2, [64], 96)
    assert 60 < f["jpeg_kb"] < 300  # COCO's JPEGs: about 160 KB
    assert f["decode_share"] == pytest.approx(f["decode_ms"] / f["mapper_ms"], abs=2e-3)
    assert f["augment_share"] == pytest.approx((f["augment_ms"] - f["decode_ms"]) / f["mapper_ms"], abs=2e-3)
    for name in ("decode", "augment", "mapper"):
        assert f[f"{name}_images_per_s"] == pytest.approx(1000 / f[f"{name}_ms"], rel=1e-2)
    for w in (0, 1):
        # 3 images per worker, in whole batches of 2: 4 asked for and counted
        assert f[f"images_w{w}"] == f[f"requested_w{w}"] == 4 and f[f"partial_w{w}"] is False
        # seconds printed to 3 decimals, the rate to 2: the rate lies between images over the
        # printed seconds' ends (0.035 s stands for 0.0345-0.0355 s, 1.4% apart)
        seconds, rate = f[f"seconds_w{w}"], f[f"images_per_s_w{w}"]
        assert f[f"images_w{w}"] / (seconds + 5e-4) - 5e-3 <= rate <= f[f"images_w{w}"] / (seconds - 5e-4) + 5e-3
        assert f[f"images_per_s_per_worker_w{w}"] == pytest.approx(f[f"images_per_s_w{w}"] / max(w, 1), abs=0.01)
        assert f[f"cpu_ms_per_image_w{w}"] > 0
    # both printed to three decimals: a small value's rounding is more than 1% of it
    assert f["workers_per_gpu"] == pytest.approx(2.5 / f["images_per_s_per_worker_w1"], rel=1e-2, abs=6e-4)
    reach = [w for w in (0, 1) if f[f"images_per_s_w{w}"] >= 2.5]
    assert f["min_workers_for_train"] == (min(reach) if reach else None)
    assert f["cpu_cores_per_gpu"] == pytest.approx(2.5 * f["cpu_ms_per_image_w1"] / 1000, abs=1e-3)
    assert f"{f['workers_per_gpu']:.1f} loader workers" in proc.stdout


def test_coco_size_jpegs_match_their_annotations(tmp_path):
    json_file, written = write_synthetic_coco(str(tmp_path / "a"), 3, seed=5)
    dicts = load_coco_json(json_file, str(tmp_path / "a"))
    assert len(dicts) == 3
    sizes = 0
    for d in dicts:
        with Image.open(d["file_name"]) as image:
            assert image.format == "JPEG" and image.size == (d["width"], d["height"])
            assert np.asarray(image).std() > 20  # content, not a flat image
        sizes += os.path.getsize(d["file_name"])
        assert all(0 <= a["bbox"][0] <= d["width"] and 0 <= a["bbox"][1] <= d["height"] for a in d["annotations"])
    assert sizes == written
    # the same seed writes the same bytes, in one process or several
    json_file_b, _ = write_synthetic_coco(str(tmp_path / "b"), 3, seed=5, jobs=2)
    for d in dicts:
        name = os.path.basename(d["file_name"])
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert open(json_file).read() == open(json_file_b).read()
