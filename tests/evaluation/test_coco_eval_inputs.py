"""Inputs that used to end in a traceback inside the evaluator, or that the two
implementations scored differently: each is refused with one line naming the file and the
entry, by both implementations alike."""

import json
import subprocess
import sys

import pytest

from largedet.evaluation import CocoInputError, evaluate_coco_results
from test_coco_eval import TOOL

IMPLS = ("faster", "pycocotools")


def _gt(**changes):
    """Two images, one category, one annotation per image (with polygons)."""
    gt = {
        "images": [{"id": 1, "width": 64, "height": 48}, {"id": 2, "width": 64, "height": 48}],
        "categories": [{"id": 1, "name": "circle"}],
        "annotations": [
            {"id": i, "image_id": i, "category_id": 1, "bbox": [4.0, 4.0, 20.0, 10.0], "area": 200.0,
             "iscrowd": 0, "segmentation": [[4.0, 4.0, 24.0, 4.0, 24.0, 14.0, 4.0, 14.0]]}
            for i in (1, 2)
        ],
    }  # fmt: skip
    gt.update(changes)
    return gt


def _det(**changes):
    det = {"image_id": 1, "category_id": 1, "bbox": [4.0, 4.0, 20.0, 10.0], "score": 0.9,
           "segmentation": {"size": [48, 64], "counts": "PPP1"}}  # fmt: skip
    det.update(changes)
    return det


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _refused_alike(gt, dt, iou_type, message):
    """Both implementations refuse with the same one-line message, containing ``message``."""
    messages = []
    for impl in IMPLS:
        with pytest.raises(CocoInputError) as refused:
            evaluate_coco_results(str(gt), str(dt), iou_type, impl=impl)
        messages.append(str(refused.value))
    assert messages[0] == messages[1] and message in messages[0] and "\n" not in messages[0], messages


def test_bad_detections_are_refused_alike(tmp_path):
    gt = _write(tmp_path, "gt.json", _gt())
    annotations = _gt()["annotations"]
    cases = [
        ("list_id.json", [_det(image_id=[1])], "bbox", "results.json: entry 0 has image_id [1], which is not in the ground truth"),
        ("rle_no_size.json", [_det(segmentation={"counts": "PPP1"})], "segm", "entry 0's segmentation is an RLE without a 'size' of [height, width]"),
        ("segm_str.json", [_det(), _det(segmentation="PPP1")], "segm", "entry 1's segmentation is neither polygons nor an RLE"),
        ("segm_poly.json", [_det(segmentation=[[1.0, 2.0]])], "segm", "entry 0's segmentation is not a list of polygons"),
    ]  # fmt: skip
    for name, dets, iou_type, message in cases:
        dt = _write(tmp_path, name, dets)
        _refused_alike(gt, dt, iou_type, message.replace("results.json", name))
    assert annotations  # the ground truth itself is fine: a valid file scores on both
    dt = _write(tmp_path, "good.json", [_det(image_id=i, segmentation=a["segmentation"]) for i, a in enumerate(annotations, 1)])
    aps = {impl: evaluate_coco_results(str(gt), str(dt), "bbox", impl=impl).ap_percent for impl in IMPLS}
    assert aps == {"faster": 100.0, "pycocotools": 100.0}


def test_bad_ground_truth_is_refused_alike(tmp_path):
    dt = _write(tmp_path, "dt.json", [_det()])
    no_area = _gt()
    del no_area["annotations"][1]["area"]
    negative = _gt()
    negative["annotations"][0]["bbox"] = [4.0, 4.0, -20.0, 10.0]
    no_image_id = _gt()
    del no_image_id["images"][1]["id"]
    rle_no_size = _gt()
    rle_no_size["annotations"][0]["segmentation"] = {"counts": [0, 10, 3062]}
    cases = [
        ("no_area.json", no_area, "bbox", "no_area.json: annotation 1 (id 2) has area null, not a finite number >= 0"),
        ("negative.json", negative, "bbox", "negative.json: annotation 0 (id 1) has bbox [4.0, 4.0, -20.0, 10.0], with a negative width or height"),
        ("no_image_id.json", no_image_id, "bbox", "no_image_id.json: image 1 has no integer or string 'id'"),
        ("gt_rle.json", rle_no_size, "segm", "gt_rle.json: annotation 0 (id 1)'s segmentation is an RLE without a 'size'"),
    ]  # fmt: skip
    for name, gt, iou_type, message in cases:
        _refused_alike(_write(tmp_path, name, gt), dt, iou_type, message)


def test_a_file_that_is_not_utf8_is_one_line_from_the_tool(tmp_path):
    gt = _write(tmp_path, "gt.json", _gt())
    dt = _write(tmp_path, "latin1.json", '[{"image_id": 1, "name": "caf\xe9"}]'.encode("latin-1"))
    for impl in IMPLS:
        done = subprocess.run([sys.executable, TOOL, "--gt", str(gt), "--dt", str(dt), "--impl", impl],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            f"error: results file {dt} is not UTF-8 text (byte 29: invalid continuation byte), which JSON must be"
        ]
