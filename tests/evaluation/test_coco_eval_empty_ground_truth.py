"""A ground truth without annotations gives no AP: reported as NaN / "n/a" with one warning,
never pycocotools' -1 printed as -100."""

import json
import logging
import math

import pytest
import torch
from detectron2.data.datasets import register_coco_instances
from detectron2.structures import Boxes, Instances

from largedet.engine.defaults import print_box_ap
from largedet.evaluation import evaluate_coco_results
from largedet.evaluation.coco_cli import main as coco_eval_main
from largedet.evaluation.coco_evaluation import COCOEvaluator


def _files(tmp_path, annotations=()):
    gt = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 64} for i in (1, 2)],
        "categories": [{"id": 1, "name": "thing"}],
        "annotations": list(annotations),
    }
    gt_path, dt_path = tmp_path / "gt.json", tmp_path / "dt.json"
    gt_path.write_text(json.dumps(gt))
    dt_path.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "score": 0.9}]))
    return str(gt_path), str(dt_path)


def test_the_tool_says_n_a_with_one_warning(tmp_path, capsys):
    gt, dt = _files(tmp_path)
    assert coco_eval_main(["--gt", gt, "--dt", dt, "--impl", "pycocotools"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "AP: n/a" and "-100" not in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {gt}: no ground-truth annotation to score against (none, or only crowd regions): "
        "AP is undefined"
    ]
    result = evaluate_coco_results(gt, dt, impl="pycocotools")
    assert list(result.stats) == [-1.0] * 12  # pycocotools' own numbers are kept as they are
    assert math.isnan(result.ap_percent) and all(math.isnan(v) for v in result.metrics.values())


def test_only_crowd_regions_are_no_ground_truth_either(tmp_path, capsys):
    crowd = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 40], "area": 1600, "iscrowd": 1}
    gt, dt = _files(tmp_path, [crowd])
    assert coco_eval_main(["--gt", gt, "--dt", dt, "--impl", "pycocotools"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "AP: n/a"


def test_a_metric_without_its_objects_is_nan_and_the_ap_a_number(tmp_path, capsys):
    """Boxes of 20 x 20 pixels are all "small": medium and large AP are undefined, AP is not."""
    box = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "area": 400, "iscrowd": 0}
    gt, dt = _files(tmp_path, [box])
    result = evaluate_coco_results(gt, dt, impl="pycocotools")
    assert result.ap_percent == pytest.approx(100.0)
    assert result.metrics["APs"] == pytest.approx(1.0) and math.isnan(result.metrics["APm"]) and math.isnan(result.metrics["APl"])
    assert coco_eval_main(["--gt", gt, "--dt", dt, "--impl", "pycocotools"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "AP: 100.000" and "warning:" not in err


def test_the_evaluator_reports_nan_and_warns_once(tmp_path, caplog, capsys, monkeypatch):
    gt, _ = _files(tmp_path)
    register_coco_instances("empty_ground_truth_test", {}, gt, str(tmp_path))
    evaluator = COCOEvaluator("empty_ground_truth_test", distributed=False, impl="pycocotools")
    evaluator.reset()
    instances = Instances((64, 64))
    instances.pred_boxes = Boxes(torch.tensor([[8.0, 8.0, 28.0, 28.0]]))
    instances.scores = torch.tensor([0.9])
    instances.pred_classes = torch.tensor([0])
    for image_id in (1, 2):
        evaluator.process([{"image_id": image_id}], [{"instances": instances}])
    monkeypatch.setattr(logging.getLogger("detectron2"), "propagate", True)
    with caplog.at_level(logging.WARNING):
        results = evaluator.evaluate()
    assert math.isnan(results["bbox"]["AP"])
    warned = [r.getMessage() for r in caplog.records if "no annotation" in r.getMessage()]
    assert warned == [
        "empty_ground_truth_test: the ground truth has no annotation (other than crowd regions) on "
        "the 2 evaluated images: AP is undefined, reported as NaN"
    ]
    capsys.readouterr()
    print_box_ap(results)
    assert capsys.readouterr().out == "box AP: n/a\n"


@pytest.mark.parametrize("impl", ["pycocotools", "auto"])
def test_no_detections_is_ap_0_with_its_own_warning(tmp_path, capsys, impl):
    """An empty results file (the model found nothing) is AP 0, not an error, and not the
    "n/a" of a ground truth without annotations: each says what it is."""
    box = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "area": 400, "iscrowd": 0}
    gt, dt = _files(tmp_path, [box])
    with open(dt, "w") as f:
        f.write("[]")
    assert coco_eval_main(["--gt", gt, "--dt", dt, "--impl", impl]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "AP: 0.000"
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        f"warning: {dt}: no detections (an empty list): the model found nothing, AP is 0"
    ]
    (tmp_path / "empty").mkdir()
    gt_empty, _ = _files(tmp_path / "empty")  # no annotation, and still no detection
    assert coco_eval_main(["--gt", gt_empty, "--dt", dt, "--impl", impl]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "AP: n/a" and "no ground-truth annotation" in err
