"""Evaluate a COCO results file against COCO-format ground truth.

The numbers are pycocotools' ``COCOeval`` (the 12 standard metrics), computed by one of
two implementations (:func:`coco_eval_impl`):

- ``"faster"``: faster-coco-eval (``pip install faster-coco-eval``), pycocotools' API with
  the per-image matching and the accumulation in C++ and mask IoUs on several threads. It
  gives pycocotools' 12 numbers (to 1e-6, ``tests/evaluation/test_faster_coco_eval.py``) in
  a fraction of the time at COCO scale (``benchmarks/coco_eval_speed.py``, figures in
  benchmarks/RESULTS.md);
- ``"pycocotools"``: pycocotools' own ``COCOeval``, Python loops over images and categories.

``"auto"`` is faster-coco-eval where it is installed, else pycocotools. Both are used
through their own classes: nothing here replaces pycocotools' modules, so importing
largedet changes no other code's evaluation.

Input is checked first so that a bad file fails with one clear message naming the file
and the entry, instead of an assertion deep inside the evaluator.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

IOU_TYPES = ("bbox", "segm")
METRIC_NAMES = (
    "AP", "AP50", "AP75", "APs", "APm", "APl",
    "AR1", "AR10", "AR100", "ARs", "ARm", "ARl",
)


class CocoInputError(ValueError):
    """A ground-truth or results file that cannot be evaluated; the message says why."""


@dataclass(frozen=True)
class CocoEvalImpl:
    """One implementation of pycocotools' API.

    ``coco`` is its ``COCO`` class; ``cocoeval(coco_gt, coco_dt, iou_type)`` builds its
    evaluator, with pycocotools' ``evaluate()``, ``accumulate()``, ``summarize()`` (printed
    to stdout), ``stats`` (12 fractions) and ``eval["precision"]`` (T x R x K x A x M).
    Objects of one implementation are not to be mixed with the other's.
    """

    name: str
    version: str
    coco: type
    cocoeval: Callable

    def __str__(self) -> str:
        return f"{_PACKAGES[self.name]} {self.version}"


def _pycocotools() -> CocoEvalImpl:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    return CocoEvalImpl("pycocotools", importlib.metadata.version("pycocotools"), COCO, COCOeval)


def _faster_coco_eval() -> CocoEvalImpl:
    import faster_coco_eval

    # print, as pycocotools does: faster-coco-eval's default logs the summary at INFO under
    # its own logger, which Detectron2's logging setup does not show.
    cocoeval = functools.partial(faster_coco_eval.COCOeval_faster, print_function=print)
    return CocoEvalImpl("faster", faster_coco_eval.__version__, faster_coco_eval.COCO, cocoeval)


# Implementation name -> its loader (raises ImportError when the package is missing).
COCO_EVAL_IMPLS = {"faster": _faster_coco_eval, "pycocotools": _pycocotools}
# Implementation name -> its package on PyPI.
_PACKAGES = {"faster": "faster-coco-eval", "pycocotools": "pycocotools"}


def coco_eval_impl(name: str = "auto") -> CocoEvalImpl:
    """The COCO evaluation implementation ``name``: ``"faster"`` (faster-coco-eval),
    ``"pycocotools"``, or ``"auto"``: faster-coco-eval where it is installed, else pycocotools.

    Raises ``ValueError`` for another name and ``ImportError`` when the one asked for is
    not installed.
    """
    if name == "auto":
        try:
            return _faster_coco_eval()
        except ImportError:
            return _pycocotools()
    if name not in COCO_EVAL_IMPLS:
        raise ValueError(
            f"COCO evaluation implementation must be 'auto' or one of {tuple(COCO_EVAL_IMPLS)}, got {name!r}"
        )
    try:
        return COCO_EVAL_IMPLS[name]()
    except ImportError as e:
        raise ImportError(f"COCO evaluation with {name!r} needs `pip install {_PACKAGES[name]}` ({e})") from e


@dataclass
class CocoEvalResult:
    """The 12 COCO metrics as fractions (pycocotools' ``stats``), its printed summary, and
    the implementation that computed them (``"faster-coco-eval 1.8.0"``).

    pycocotools writes -1 for a metric that the ground truth cannot define (no annotation
    of that area, or none at all); :attr:`metrics` and :attr:`ap_percent` give NaN there,
    as Detectron2's ``COCOEvaluator`` does, never -1 or -100."""

    stats: np.ndarray
    summary: str
    impl: str
    detections: int = 0  # entries of the results file (0: the model detected nothing)

    @property
    def metrics(self) -> dict:
        """``{"AP": fraction, ...}``; NaN where the ground truth defines no value."""
        return {name: float(v) if v >= 0 else math.nan for name, v in zip(METRIC_NAMES, self.stats)}

    @property
    def ap_percent(self) -> float:
        """COCO AP@[.5:.95] in percent, as Detectron2 reports it; NaN where the ground truth
        has no annotation to score against."""
        return self.metrics["AP"] * 100.0


def _load_json(path: str, what: str):
    if not os.path.isfile(path):
        raise CocoInputError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CocoInputError(f"{what} file {path} is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise CocoInputError(
            f"{what} file {path} is not UTF-8 text (byte {e.start}: {e.reason}), which JSON must be"
        ) from None


def _is_number(value) -> bool:
    """A finite JSON number (not a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_id(value) -> bool:
    """An id COCO's indexes can hold: an integer or a string (not a bool, a list, a float)."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _segmentation_problem(segm) -> str | None:
    """Why ``segm`` is no COCO segmentation (polygons ``[[x1, y1, x2, y2, x3, y3, ...], ...]``
    or an RLE ``{"counts": str or [int], "size": [height, width]}``); None when it is one."""
    if isinstance(segm, list):
        if not segm or not all(
            isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(_is_number(v) for v in p)
            for p in segm
        ):
            return "is not a list of polygons [x1, y1, x2, y2, x3, y3, ...] of finite numbers"
        return None
    if isinstance(segm, dict):
        size = segm.get("size")
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)):
            return "is an RLE without a 'size' of [height, width]"
        counts = segm.get("counts")
        if not (isinstance(counts, str) or (isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in counts))):
            return "is an RLE without 'counts' (a string or a list of integers)"
        return None
    return "is neither polygons nor an RLE"


def _box_problem(box) -> str | None:
    if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
        return "which is not [x, y, w, h] of finite numbers"
    if box[2] < 0 or box[3] < 0:
        return "with a negative width or height"
    return None


def _check_gt(gt: dict, path: str, iou_type: str) -> None:
    """Every image with an id, every category with an id, every annotation with an image and
    a category of the file, a box of finite numbers with a width and height >= 0, an area
    (both implementations need it: pycocotools fails without one, faster-coco-eval scores
    such an annotation as if it matched) and, for ``"segm"``, a segmentation."""
    for key in ("images", "categories", "annotations"):
        if not isinstance(gt[key], list):
            raise CocoInputError(f"ground-truth file {path}: '{key}' is not a list")
    for what, entries in (("image", gt["images"]), ("category", gt["categories"])):
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not _is_id(entry.get("id")):
                raise CocoInputError(f"ground-truth file {path}: {what} {i} has no integer or string 'id'")
    image_ids = {img["id"] for img in gt["images"]}
    category_ids = {cat["id"] for cat in gt["categories"]}
    for i, ann in enumerate(gt["annotations"]):
        if not isinstance(ann, dict):
            raise CocoInputError(f"ground-truth file {path}: annotation {i} is not an object")
        name = f"annotation {i}" + (f" (id {ann['id']!r})" if _is_id(ann.get("id")) else "")
        if not _is_id(ann.get("id")):
            raise CocoInputError(f"ground-truth file {path}: {name} has no integer or string 'id'")
        if not _is_id(ann.get("image_id")) or ann["image_id"] not in image_ids:
            raise CocoInputError(
                f"ground-truth file {path}: {name} has image_id {json.dumps(ann.get('image_id'))}, "
                "which is not an image of the file"
            )
        if not _is_id(ann.get("category_id")) or ann["category_id"] not in category_ids:
            raise CocoInputError(
                f"ground-truth file {path}: {name} has category_id {json.dumps(ann.get('category_id'))}, "
                "which is not a category of the file"
            )
        problem = _box_problem(ann.get("bbox"))
        if problem:
            raise CocoInputError(f"ground-truth file {path}: {name} has bbox {json.dumps(ann.get('bbox'))}, {problem}")
        if not _is_number(ann.get("area")) or ann["area"] < 0:
            raise CocoInputError(
                f"ground-truth file {path}: {name} has area {json.dumps(ann.get('area'))}, not a finite "
                "number >= 0 (COCO's evaluation needs it for its small, medium and large ranges)"
            )
        if iou_type == "segm":
            problem = _segmentation_problem(ann.get("segmentation"))
            if problem:
                raise CocoInputError(f"ground-truth file {path}: {name}'s segmentation {problem}")


def _check_results(results, gt: dict, path: str, iou_type: str) -> None:
    if not isinstance(results, list):
        raise CocoInputError(f"results file {path} must hold a JSON list of detections")
    image_ids = {img["id"] for img in gt.get("images", [])}
    category_ids = {cat["id"] for cat in gt.get("categories", [])}
    for i, det in enumerate(results):
        if not isinstance(det, dict):
            raise CocoInputError(f"results file {path}: entry {i} is not an object")
        required = ("image_id", "category_id", "score", "bbox" if iou_type == "bbox" else "segmentation")
        for key in required:
            if key not in det:
                raise CocoInputError(f"results file {path}: entry {i} has no '{key}'")
        if not _is_id(det["image_id"]) or det["image_id"] not in image_ids:
            raise CocoInputError(
                f"results file {path}: entry {i} has image_id {json.dumps(det['image_id'])}, "
                "which is not in the ground truth"
            )
        if not _is_id(det["category_id"]) or det["category_id"] not in category_ids:
            raise CocoInputError(
                f"results file {path}: entry {i} has category_id {json.dumps(det['category_id'])}, "
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
        else:
            problem = _segmentation_problem(det["segmentation"])
            if problem:
                raise CocoInputError(f"results file {path}: entry {i}'s segmentation {problem}")


def evaluate_coco_results(
    gt_path: str, results_path: str, iou_type: str = "bbox", impl: str = "pycocotools"
) -> CocoEvalResult:
    """Run ``COCOeval`` of :func:`coco_eval_impl` ``(impl)`` on ``results_path`` against
    ``gt_path``; a results file with boxes and masks scores ``"segm"`` with the box areas, as
    pycocotools does. A results file without detections (``[]``: the model found nothing)
    scores 0 wherever the ground truth defines a metric.

    Raises :class:`CocoInputError` for a missing file, malformed JSON or text that is not
    UTF-8; a ground-truth image or category without an id, an annotation without an id,
    an image or a category of the file, with a box that is not four finite numbers with a
    width and height >= 0, without an area, or (``"segm"``) without a valid segmentation;
    a detection (named by its index) that lacks a key, whose image or category is not in
    the ground truth (or is no id: a list, a float), whose score is not a finite number
    (NaN, null, a string), whose box is not four finite numbers with a width and height
    >= 0, or (``"segm"``) whose segmentation is neither polygons nor an RLE with its
    ``size``. Both implementations see the same checked input. ``ValueError`` for an
    unknown ``impl`` and ``ImportError`` for ``"faster"`` without faster-coco-eval.
    """
    if iou_type not in IOU_TYPES:
        raise CocoInputError(f"iou type must be one of {IOU_TYPES}, got {iou_type!r}")
    api = coco_eval_impl(impl)
    gt = _load_json(gt_path, "ground-truth")
    if not isinstance(gt, dict) or "images" not in gt or "categories" not in gt:
        raise CocoInputError(f"ground-truth file {gt_path} is not a COCO instances file (needs images, categories)")
    gt.setdefault("annotations", [])
    _check_gt(gt, gt_path, iou_type)
    results = _load_json(results_path, "results")
    _check_results(results, gt, results_path, iou_type)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        coco_gt = api.coco()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        if results:
            coco_dt = coco_gt.loadRes(results)
        else:  # no detection: every defined metric is 0 (pycocotools' loadRes needs one)
            coco_dt = api.coco()
            coco_dt.dataset = {"images": gt["images"], "categories": gt["categories"], "annotations": []}
            coco_dt.createIndex()
        evaluator = api.cocoeval(coco_gt, coco_dt, iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        evaluator.summarize()
    # The 12 metrics' lines; faster-coco-eval prints AR at IoU 0.5 and 0.75 after them.
    lines = summary.getvalue().splitlines(keepends=True)[: len(METRIC_NAMES)]
    return CocoEvalResult(stats=np.asarray(evaluator.stats, dtype=np.float64), summary="".join(lines),
                          impl=str(api), detections=len(results))  # fmt: skip
