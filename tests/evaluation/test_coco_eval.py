"""tools/coco_eval.py reproduces pycocotools called directly, and rejects bad input clearly."""

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from largedet.evaluation import CocoInputError, coco_cli, evaluate_coco_results

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "coco_eval.py")


def _random_results(gt_json, seed, with_masks=False):
    """Noisy copies of the ground truth plus random false positives."""
    rng = np.random.default_rng(seed)
    coco = COCO(gt_json)
    results = []
    for ann in coco.loadAnns(coco.getAnnIds()):
        x, y, w, h = ann["bbox"]
        jitter = rng.normal(0, 3, size=4)
        det = {
            "image_id": ann["image_id"],
            "category_id": int(rng.choice([ann["category_id"], 1, 2, 3], p=[0.7, 0.1, 0.1, 0.1])),
            "bbox": [float(x + jitter[0]), float(y + jitter[1]), float(max(1, w + jitter[2])), float(max(1, h + jitter[3]))],
            "score": float(rng.uniform(0.05, 1.0)),
        }
        if with_masks:
            det["segmentation"] = ann["segmentation"]
        results.append(det)
    for image_id in coco.getImgIds():
        x, y = rng.uniform(0, 40, size=2)
        results.append({"image_id": image_id, "category_id": 1, "bbox": [float(x), float(y), 10.0, 12.0],
                        "score": float(rng.uniform(0, 0.5)), "segmentation": coco.loadAnns(coco.getAnnIds())[0]["segmentation"]})
    return results


def _pycocotools_stats(gt_json, results, iou_type):
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(gt_json)
        ev = COCOeval(gt, gt.loadRes(results), iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return np.array(ev.stats)


@pytest.mark.parametrize("iou_type,seed", [("bbox", 0), ("bbox", 1), ("segm", 2)])
def test_matches_pycocotools(tiny_shapes, tmp_path, iou_type, seed):
    gt_json = tiny_shapes.json_file("train")
    results = _random_results(gt_json, seed, with_masks=iou_type == "segm")
    dt_json = tmp_path / "results.json"
    dt_json.write_text(json.dumps(results))
    expected = _pycocotools_stats(gt_json, results, iou_type)
    got = evaluate_coco_results(gt_json, str(dt_json), iou_type)
    np.testing.assert_array_equal(got.stats, expected)
    assert 0 < expected[0] < 1  # a non-trivial case

    out = subprocess.run([sys.executable, TOOL, "--gt", gt_json, "--dt", str(dt_json), "--iou-type", iou_type],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len([ln for ln in lines if "Average" in ln]) == 12
    assert lines[-1] == f"AP: {expected[0] * 100:.3f}"


def _run_tool(gt, dt):
    return subprocess.run([sys.executable, TOOL, "--gt", str(gt), "--dt", str(dt)], capture_output=True, text=True)


def test_cli_errors_are_one_clear_line(tiny_shapes, tmp_path, capsys):
    gt_json = tiny_shapes.json_file("val")
    good = {"image_id": 1, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}
    cases = {
        "missing.json": (None, "results file not found"),
        "broken.json": ("[{", "is not valid JSON"),
        "bad_image.json": (json.dumps([good, dict(good, image_id=999)]), "entry 1 has image_id 999, which is not in the ground truth"),
        "bad_cat.json": (json.dumps([dict(good, category_id=42)]), "entry 0 has category_id 42, which is not in the ground truth"),
        "no_bbox.json": (json.dumps([{"image_id": 1, "category_id": 1, "score": 0.1}]), "entry 0 has no 'bbox'"),
        "no_score.json": (json.dumps([good, {"image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]}]),
                          "entry 1 has no 'score'"),
        "nan_score.json": (json.dumps([good, good, dict(good, score=float("nan"))]),
                           "entry 2 has score NaN, which is not a finite number"),
        "null_score.json": (json.dumps([good, dict(good, score=None)]), "entry 1 has score null, which is not a finite number"),
        "str_score.json": (json.dumps([dict(good, score="0.5")]), 'entry 0 has score "0.5", which is not a finite number'),
        "negative_w.json": (json.dumps([good, dict(good, bbox=[1.0, 2.0, -3.0, 4.0])]),
                            "entry 1 has bbox [1.0, 2.0, -3.0, 4.0] with a negative width or height"),
        "negative_h.json": (json.dumps([dict(good, bbox=[1.0, 2.0, 3.0, -0.5])]),
                            "entry 0 has bbox [1.0, 2.0, 3.0, -0.5] with a negative width or height"),
        "inf_box.json": (json.dumps([good, dict(good, bbox=[float("inf"), 2.0, 3.0, 4.0])]),
                         "entry 1 has bbox [Infinity, 2.0, 3.0, 4.0], which is not [x, y, w, h] of finite numbers"),
        "short_box.json": (json.dumps([dict(good, bbox=[1.0, 2.0, 3.0])]),
                           "entry 0 has bbox [1.0, 2.0, 3.0], which is not [x, y, w, h] of finite numbers"),
    }  # fmt: skip
    # the command line's main() in this process for each case (a process each took 4-5 s)
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        capsys.readouterr()
        assert coco_cli.main(["--gt", gt_json, "--dt", str(path)]) == 1, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0] and name in err[0], (name, err)
    # the tool itself, once each way: the exit status and the one line reach the shell
    out = _run_tool(gt_json, tmp_path / "bad_cat.json")
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(err) == 1 and cases["bad_cat.json"][1] in err[0], out.stderr
    out = _run_tool(tmp_path / "nope.json", tmp_path / "broken.json")
    assert out.returncode == 1 and "ground-truth file not found" in out.stderr


def test_library_raises_input_error(tiny_shapes, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(CocoInputError, match="JSON list"):
        evaluate_coco_results(tiny_shapes.json_file("val"), str(path))


def test_nan_scores_are_rejected_not_silently_ranked(tiny_shapes, tmp_path):
    """pycocotools takes NaN scores and ranks them wrong (AP 50 where real scores give 100);
    the file is refused instead, naming the detection."""
    gt_json = tiny_shapes.json_file("val")
    coco = COCO(gt_json)
    anns = coco.loadAnns(coco.getAnnIds())
    perfect = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
               for a in anns]  # fmt: skip
    path = tmp_path / "perfect.json"
    path.write_text(json.dumps(perfect))
    assert evaluate_coco_results(gt_json, str(path)).ap_percent == 100.0
    path.write_text(json.dumps([dict(d, score=float("nan")) for d in perfect]))
    with pytest.raises(CocoInputError, match=f"{path}: entry 0 has score NaN"):
        evaluate_coco_results(gt_json, str(path))
