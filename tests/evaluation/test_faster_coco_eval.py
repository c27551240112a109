"""faster-coco-eval gives pycocotools' 12 COCO metrics (to 1e-6) on random fixtures with
crowd regions, through largedet.evaluation.coco, tools/coco_eval.py and the trainer's
COCOEvaluator; without it, pycocotools evaluates as before."""

import contextlib
import copy
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from largedet.evaluation.coco import coco_eval_impl, evaluate_coco_results
from synthetic_coco import synthetic_coco_instances
from largedet.evaluation.coco_evaluation import COCOEvaluator

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "coco_eval.py")
HAS_FASTER = importlib.util.find_spec("faster_coco_eval") is not None
requires_faster = pytest.mark.skipif(
    not HAS_FASTER, reason="faster-coco-eval is not installed (pip install faster-coco-eval)"
)


def _fixture(seed):
    """12 images, 4 categories, about 15% crowd regions (uncompressed RLE), 20 detections
    per image with boxes and RLE masks."""
    return synthetic_coco_instances(
        12, num_categories=4, gt_per_image=6, dets_per_image=20, crowd_fraction=0.15, seed=seed
    )


def _evaluate(coco_cls, cocoeval_cls, gt, results, iou_type):
    """COCOeval on private copies (both implementations write into the dicts), quietly."""
    gt = {**gt, "annotations": [dict(a) for a in gt["annotations"]]}
    results = [dict(r) for r in results]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = coco_cls()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        evaluator = cocoeval_cls(coco_gt, coco_gt.loadRes(results), iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


@requires_faster
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_faster_gives_pycocotools_metrics_with_crowds_and_all_sizes(iou_type, seed):
    gt, results = _fixture(seed)
    non_crowd_areas = np.array([a["area"] for a in gt["annotations"] if not a["iscrowd"]])
    assert sum(a["iscrowd"] for a in gt["annotations"]) >= 3
    assert all(isinstance(a["segmentation"]["counts"], list) for a in gt["annotations"] if a["iscrowd"])
    assert (non_crowd_areas < 32**2).sum() >= 5 and (non_crowd_areas > 96**2).sum() >= 5
    assert ((non_crowd_areas >= 32**2) & (non_crowd_areas <= 96**2)).sum() >= 5
    if iou_type == "segm":  # as Detectron2 evaluates masks: the mask area decides the size
        results = [{k: v for k, v in r.items() if k != "bbox"} for r in results]

    expected = _evaluate(COCO, COCOeval, gt, results, iou_type)
    faster = coco_eval_impl("faster")
    got = _evaluate(faster.coco, faster.cocoeval, gt, results, iou_type)

    assert expected.stats.shape == (12,) and all(0 < s < 1 for s in expected.stats)  # every metric defined
    np.testing.assert_allclose(got.stats, expected.stats, rtol=0, atol=1e-6)
    # Detectron2's per-category AP reads the precision array
    np.testing.assert_allclose(got.eval["precision"], expected.eval["precision"], rtol=0, atol=1e-6)
    # faster-coco-eval was used through its own classes: pycocotools is still pycocotools
    assert sys.modules["pycocotools.cocoeval"].COCOeval is COCOeval and COCOeval.__module__ == "pycocotools.cocoeval"


@requires_faster
def test_tool_and_library_impl_flag(tmp_path):
    gt, results = _fixture(2)
    gt_json, dt_json = tmp_path / "gt.json", tmp_path / "dt.json"
    gt_json.write_text(json.dumps(gt))
    dt_json.write_text(json.dumps(results))
    for iou_type in ("bbox", "segm"):
        faster = evaluate_coco_results(str(gt_json), str(dt_json), iou_type, impl="faster")
        reference = evaluate_coco_results(str(gt_json), str(dt_json), iou_type, impl="pycocotools")
        assert faster.impl.startswith("faster-coco-eval ") and reference.impl.startswith("pycocotools ")
        np.testing.assert_allclose(faster.stats, reference.stats, rtol=0, atol=1e-6)
        assert faster.summary == reference.summary
    assert evaluate_coco_results(str(gt_json), str(dt_json), "segm", impl="auto").impl == faster.impl

    runs = {
        impl: subprocess.run([sys.executable, TOOL, "--gt", str(gt_json), "--dt", str(dt_json), "--iou-type", "segm",
                              "--impl", impl], capture_output=True, text=True)
        for impl in ("faster", "pycocotools")
    }  # fmt: skip
    for impl, out in runs.items():
        assert out.returncode == 0, out.stderr
        used = faster.impl if impl == "faster" else reference.impl
        assert out.stderr.strip().splitlines()[-1] == f"evaluated by {used}"
    assert runs["faster"].stdout == runs["pycocotools"].stdout
    assert runs["faster"].stdout.strip().splitlines()[-1] == f"AP: {reference.stats[0] * 100:.3f}"


def test_without_faster_coco_eval_pycocotools_evaluates(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)  # import fails as if not installed
    assert coco_eval_impl("auto").name == "pycocotools"
    assert coco_eval_impl("pycocotools").coco is COCO
    with pytest.raises(ImportError, match="pip install faster-coco-eval"):
        coco_eval_impl("faster")
    with pytest.raises(ValueError, match="one of"):
        coco_eval_impl("detectron2")

    gt, results = _fixture(3)
    gt_json, dt_json = tmp_path / "gt.json", tmp_path / "dt.json"
    gt_json.write_text(json.dumps(gt))
    dt_json.write_text(json.dumps(results))
    got = evaluate_coco_results(str(gt_json), str(dt_json), "bbox", impl="auto")
    assert got.impl.startswith("pycocotools ")
    np.testing.assert_array_equal(got.stats, _evaluate(COCO, COCOeval, gt, results, "bbox").stats)


@pytest.fixture(scope="module")
def synthetic_dataset(tmp_path_factory):
    """The fixture's ground truth registered as a Detectron2 dataset (metadata only: the
    evaluator reads the JSON), and its detections with contiguous category ids."""
    from detectron2.data import MetadataCatalog

    # 60 detections per image: about 15 per category, so that max_dets_per_image 12 cuts
    gt, results = synthetic_coco_instances(
        12, num_categories=4, gt_per_image=6, dets_per_image=60, crowd_fraction=0.15, seed=4
    )
    path = tmp_path_factory.mktemp("faster_coco_eval") / "gt.json"
    path.write_text(json.dumps(gt))
    ids = [c["id"] for c in gt["categories"]]
    MetadataCatalog.get("faster_coco_eval_fixture").set(
        json_file=str(path),
        thing_classes=[c["name"] for c in gt["categories"]],
        thing_dataset_id_to_contiguous_id={dataset_id: i for i, dataset_id in enumerate(ids)},
        evaluator_type="coco",
    )
    for r in results:
        r["category_id"] = ids.index(r["category_id"])
    return "faster_coco_eval_fixture", results


def _evaluator_results(dataset_name, results, tmp_path, impl, **kwargs):
    """COCOEvaluator's results on ``results`` as :meth:`process` would have gathered them,
    for every image but the first (left out as unreadable), and its results file."""
    evaluator = COCOEvaluator(dataset_name, distributed=False, output_dir=str(tmp_path / impl), impl=impl, **kwargs)
    evaluator.reset()
    by_image = {}
    for r in copy.deepcopy(results):
        by_image.setdefault(r["image_id"], []).append(r)
    evaluator._predictions = [{"image_id": i, "instances": by_image[i]} for i in sorted(by_image)[1:]]
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = evaluator.evaluate()
    written = json.loads((tmp_path / impl / "coco_instances_results.json").read_text())
    return evaluator, metrics, written


@requires_faster
@pytest.mark.parametrize("max_dets", [None, 12, 5])  # 5: maxDets [1, 10, 5], sorted by both
def test_coco_evaluator_faster_gives_detectron2_results(synthetic_dataset, tmp_path, max_dets):
    dataset_name, results = synthetic_dataset
    kwargs = {} if max_dets is None else {"max_dets_per_image": max_dets}
    faster, got, got_file = _evaluator_results(dataset_name, results, tmp_path, "faster", **kwargs)
    reference, expected, expected_file = _evaluator_results(dataset_name, results, tmp_path, "pycocotools", **kwargs)
    assert faster._impl.name == "faster" and reference._impl.name == "pycocotools"

    assert got_file == expected_file and got_file[0]["category_id"] in {1, 2, 3, 4}
    assert list(got) == list(expected) == ["bbox", "segm"]
    for task in ("bbox", "segm"):
        assert list(got[task]) == list(expected[task])  # AP, AP50, ..., APl, AP-category_1, ...
        assert len(got[task]) == 6 + 4 and 0 < expected[task]["AP"] < 100
        values = [got[task][k] for k in got[task]]
        np.testing.assert_allclose(values, [expected[task][k] for k in got[task]], rtol=0, atol=1e-4)  # percent


def test_trainer_evaluator_picks_by_availability_and_logs_once(tiny_shapes, tmp_path, monkeypatch):
    import detectron2.utils.logger as d2_logger

    from largedet.engine import Trainer, largedet_argument_parser, setup_cfg

    cfg = setup_cfg(
        largedet_argument_parser().parse_args(["--config", "configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml"]),
        log=False,
    )
    monkeypatch.setattr(d2_logger, "_LOG_COUNTER", Counter())  # a fresh "once per process"
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("largedet.evaluation.coco_evaluation")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for _ in range(2):
            evaluator = Trainer.build_evaluator(cfg, "tiny_shapes_val", str(tmp_path))
        monkeypatch.setitem(sys.modules, "faster_coco_eval", None)
        fallback = Trainer.build_evaluator(cfg, "tiny_shapes_val", str(tmp_path))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    assert isinstance(evaluator, COCOEvaluator) and fallback._impl.name == "pycocotools"
    messages = [r.getMessage() for r in records]
    if HAS_FASTER:
        assert evaluator._impl.name == "faster"
        assert messages == [f"COCO evaluation by {evaluator._impl}'s COCOeval (pycocotools' numbers)",
                            f"COCO evaluation by {fallback._impl}'s COCOeval"]  # fmt: skip
    else:
        assert messages == [f"COCO evaluation by {fallback._impl}'s COCOeval"]
