"""Importing largedet changes nothing in Detectron2.

``tests/d2_entry_points.py`` exercises Detectron2's public entry points (COCOEvaluator
with its defaults, build_model and a Faster R-CNN forward, detectron2.layers, the
environment report) in two fresh interpreters, one plain and one that imports
largedet first; whatever each call did, result or error, must be the same in both.
"""

import json
import os
import subprocess
import sys

import pytest

PROBE = os.path.join(os.path.dirname(__file__), "d2_entry_points.py")
ENTRY_POINTS = ("coco_evaluator", "faster_rcnn", "layers", "compiled_extension")


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """What the entry points did: {"plain": ..., "with_largedet": ...}."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    runs = {}
    for name, flags in (("plain", []), ("with_largedet", ["--with-largedet"])):
        work_dir = tmp_path_factory.mktemp(name)
        proc = subprocess.Popen(
            [sys.executable, PROBE, str(work_dir), *flags],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        runs[name] = (proc, work_dir)
    results = {}
    for name, (proc, work_dir) in runs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        with open(work_dir / "observed.json") as f:
            results[name] = json.load(f)
    return results


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_the_same_with_and_without_largedet(observed, entry_point):
    assert observed["with_largedet"][entry_point] == observed["plain"][entry_point]


def test_coco_evaluator_with_defaults_evaluates(observed):
    """Detectron2's COCOEvaluator with default arguments runs (pycocotools where the compiled
    evaluator is absent). Both images' first box is a hit at IoU thresholds 0.5-0.7 (IoU 1 and
    0.71): AP 1 at those 5; at the 5 from 0.75 only image 1's, ranked first among the two 0.9
    scores: precision 1 up to recall 0.5, AP 51/101. AP = (5 + 5 * 51/101) / 10."""
    bbox = observed["plain"]["coco_evaluator"]["ok"]["bbox"]
    assert bbox["AP50"] == 100.0
    assert bbox["AP75"] == round(100 * 51 / 101, 6)
    assert bbox["AP"] == round(100 * (5 + 5 * 51 / 101) / 10, 6)


def test_detectron2_models_and_layers_run(observed):
    """The plain run itself worked: a training and an inference forward, NMS, RoIAlign."""
    faster_rcnn = observed["plain"]["faster_rcnn"]["ok"]
    assert set(faster_rcnn["losses"]) == {"loss_cls", "loss_box_reg", "loss_rpn_cls", "loss_rpn_loc"}
    assert faster_rcnn["detections"] > 0
    layers = observed["plain"]["layers"]["ok"]
    # IoU(box0, box1) = 81 / 119 = 0.68 > 0.5: box1 is suppressed, unless in another class
    assert layers["nms"] == [0, 2]
    assert layers["batched_nms"] == [0, 1, 2]
    # channel 0 holds 4y + x; the RoI (0.5, 0.5)-(3.5, 2.5), shifted by half a pixel (aligned),
    # has 2x2 bins whose 2x2 samples average to x = 0.75 or 2.25 and y = 0.5 or 1.5
    assert layers["roi_align"][:4] == [2.75, 4.25, 6.75, 8.25]
