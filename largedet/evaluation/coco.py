"""Evaluate a COCO results file against COCO-format ground truth.

The numbers are pycocotools' ``COCOeval`` (the 12 standard metrics). Input is
checked first so that a bad file fails with one clear message naming the file
and the entry, instead of an assertion deep inside pycocotools.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from dataclasses import dataclass

import numpy as np

IOU_TYPES = ("bbox", "segm")
METRIC_NAMES = (
    "AP", "AP50", "AP75", "APs", "APm", "APl",
    "AR1", "AR10", "AR100", "ARs", "ARm", "ARl",
)


class CocoInputError(ValueError):
    """A ground-truth or results file that cannot be evaluated; the message says why."""


@dataclass
class CocoEvalResult:
    """The 12 COCO metrics as fractions (pycocotools' ``stats``), and its printed summary."""

    stats: np.ndarray
    summary: str

    @property
    def metrics(self) -> dict:
        return dict(zip(METRIC_NAMES, (float(v) for v in self.stats)))

    @property
    def ap_percent(self) -> float:
        """COCO AP@[.5:.95] in percent, as Detectron2 reports it."""
        return float(self.stats[0]) * 100.0


def _load_json(path: str, what: str):
    if not os.path.isfile(path):
        raise CocoInputError(f"{what} file not found: {path}")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CocoInputError(f"{what} file {path} is not valid JSON: {e}") from None


def _is_number(value) -> bool:
    """A finite JSON number (not a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_results(results, gt: dict, path: str, iou_type: str) -> None:
    if not isinstance(results, list):
        raise CocoInputError(f"results file {path} must hold a JSON list of detections")
    if not results:
        raise CocoInputError(f"results file {path} holds no detections")
    image_ids = {img["id"] for img in gt.get("images", [])}
    category_ids = {cat["id"] for cat in gt.get("categories", [])}
    for i, det in enumerate(results):
        if not isinstance(det, dict):
            raise CocoInputError(f"results file {path}: entry {i} is not an object")
        required = ("image_id", "category_id", "score", "bbox" if iou_type == "bbox" else "segmentation")
        for key in required:
            if key not in det:
                raise CocoInputError(f"results file {path}: entry {i} has no '{key}'")
        if det["image_id"] not in image_ids:
            raise CocoInputError(
                f"results file {path}: entry {i} has image_id {det['image_id']!r}, "
                "which is not in the ground truth"
            )
        if det["category_id"] not in category_ids:
            raise CocoInputError(
                f"results file {path}: entry {i} has category_id {det['category_id']!r}, "
                "which is not in the ground truth"
            )
        # pycocotools ranks by score without checking it: NaN scores are silently ranked
        # wrong, and a null or string score fails deep inside COCOeval.
        if not _is_number(det["score"]):
            raise CocoInputError(
                f"results file {path}: entry {i} has score {json.dumps(det['score'])}, which is not a "
                "finite number"
            )
        if iou_type == "bbox":
            box = det["bbox"]
            if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
                raise CocoInputError(
                    f"results file {path}: entry {i} has bbox {json.dumps(box)}, which is not [x, y, w, h] "
                    "of finite numbers"
                )
            if box[2] < 0 or box[3] < 0:
                raise CocoInputError(
                    f"results file {path}: entry {i} has bbox {json.dumps(box)} with a negative width or height"
                )


def evaluate_coco_results(gt_path: str, results_path: str, iou_type: str = "bbox") -> CocoEvalResult:
    """Run pycocotools' ``COCOeval`` on ``results_path`` against ``gt_path``.

    Raises :class:`CocoInputError` for a missing file, malformed JSON, or a
    detection (named by its index) that lacks a key, whose image or category is not in
    the ground truth, whose score is not a finite number (NaN, null, a string), or whose
    box is not four finite numbers with a width and height >= 0.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if iou_type not in IOU_TYPES:
        raise CocoInputError(f"iou type must be one of {IOU_TYPES}, got {iou_type!r}")
    gt = _load_json(gt_path, "ground-truth")
    if not isinstance(gt, dict) or "images" not in gt or "categories" not in gt:
        raise CocoInputError(f"ground-truth file {gt_path} is not a COCO instances file (needs images, categories)")
    gt.setdefault("annotations", [])
    results = _load_json(results_path, "results")
    _check_results(results, gt, results_path, iou_type)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results)
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        evaluator.summarize()
    return CocoEvalResult(stats=np.asarray(evaluator.stats, dtype=np.float64), summary=summary.getvalue())
