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

:func:`synthetic_coco_instances` makes seeded COCO-like ground truth and detections (boxes,
masks, crowd regions) for the equality test and the speed benchmark.
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
    the implementation that computed them (``"faster-coco-eval 1.8.0"``)."""

    stats: np.ndarray
    summary: str
    impl: str

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
    pycocotools does.

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
        coco_dt = coco_gt.loadRes(results)
        evaluator = api.cocoeval(coco_gt, coco_dt, iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        evaluator.summarize()
    # The 12 metrics' lines; faster-coco-eval prints AR at IoU 0.5 and 0.75 after them.
    lines = summary.getvalue().splitlines(keepends=True)[: len(METRIC_NAMES)]
    return CocoEvalResult(stats=np.asarray(evaluator.stats, dtype=np.float64), summary="".join(lines), impl=str(api))


# Frequent COCO image sizes, (width, height).
_COCO_IMAGE_SIZES = ((640, 480), (640, 427), (480, 640), (640, 426), (427, 640), (640, 424), (500, 375), (612, 612))


def _random_boxes(rng: np.random.Generator, n: int, width: int, height: int, median_side: float) -> np.ndarray:
    """(n, 4) XYWH boxes inside the image: the side (square root of the area) log-normal
    around ``median_side`` pixels (sigma 1.2), the aspect ratio log-normal around 1."""
    side = np.exp(rng.normal(np.log(median_side), 1.2, n))
    aspect = np.exp(rng.normal(0.0, 0.5, n))
    w = np.clip(side * np.sqrt(aspect), 2.0, width)
    h = np.clip(side / np.sqrt(aspect), 2.0, height)
    x = rng.uniform(0.0, 1.0, n) * (width - w)
    y = rng.uniform(0.0, 1.0, n) * (height - h)
    return np.stack([x, y, w, h], axis=1)


def _ellipse_polygons(rng: np.random.Generator, boxes: np.ndarray, vertices: int = 16) -> list:
    """One polygon ``[x1, y1, x2, y2, ...]`` per box: the inscribed ellipse with each
    radius shrunk by a random 0-15%, so that masks differ from their boxes and each other."""
    angle = np.linspace(0.0, 2.0 * np.pi, vertices, endpoint=False)
    radius = rng.uniform(0.85, 1.0, (len(boxes), vertices))
    cx, cy = boxes[:, 0:1] + boxes[:, 2:3] / 2, boxes[:, 1:2] + boxes[:, 3:4] / 2
    px = cx + boxes[:, 2:3] / 2 * radius * np.cos(angle)
    py = cy + boxes[:, 3:4] / 2 * radius * np.sin(angle)
    return [np.round(np.stack([x, y], axis=1).ravel(), 2).tolist() for x, y in zip(px, py)]


def _uncompressed_rle(rle: dict) -> dict:
    """COCO's uncompressed RLE (``counts`` a list, as the crowd regions of instances_val2017.json)."""
    from pycocotools import mask as mask_util

    flat = mask_util.decode(rle).ravel(order="F")
    ends = np.concatenate([np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    counts = np.diff(np.concatenate([[0], ends])).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"counts": counts, "size": list(rle["size"])}


def synthetic_coco_instances(
    num_images: int,
    *,
    num_categories: int = 80,
    gt_per_image: float = 7.4,
    dets_per_image: int = 100,
    crowd_fraction: float = 0.01,
    seed: int = 0,
) -> tuple[dict, list]:
    """Seeded COCO-like ground truth and detections, ``(instances dict, results list)``.

    At the defaults and 5,000 images it has the shape of COCO val2017 and a Mask R-CNN's
    results on it: frequent COCO image sizes, Poisson(``gt_per_image``) objects per image
    (val2017: 36,781 on 5,000 images, 7.4 each) with polygon masks and box sides log-normal
    around 50 px (by mask area about 42% small, 34% medium, 24% large; val2017: 41/34/24),
    ``crowd_fraction`` of them crowd regions (``iscrowd`` 1, uncompressed RLE, larger);
    ``dets_per_image`` detections per image, each with ``bbox``, a compressed-RLE
    ``segmentation`` and a score: 1 + Poisson(1) noisy copies of each object (10% with
    another category, scores in 0.3-1), then false positives (scores in 0-0.6), the top
    ``dets_per_image`` by score kept.
    Category ids are 1..``num_categories``; image and annotation ids start at 1.
    """
    from pycocotools import mask as mask_util

    rng = np.random.default_rng(seed)
    images, annotations, results = [], [], []
    for image_id in range(1, num_images + 1):
        width, height = _COCO_IMAGE_SIZES[rng.integers(len(_COCO_IMAGE_SIZES))]
        images.append({"id": image_id, "width": width, "height": height, "file_name": f"{image_id:012d}.jpg"})

        n = int(rng.poisson(gt_per_image))
        crowd = rng.random(n) < crowd_fraction
        boxes = _random_boxes(rng, n, width, height, median_side=50.0)
        boxes[crowd] = _random_boxes(rng, int(crowd.sum()), width, height, median_side=150.0)
        categories = rng.integers(1, num_categories + 1, n)
        polygons = _ellipse_polygons(rng, boxes)
        for category, is_crowd, polygon in zip(categories, crowd, polygons):
            rle = mask_util.frPyObjects([polygon], height, width)[0]
            xs, ys = polygon[0::2], polygon[1::2]
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": int(category),
                "segmentation": _uncompressed_rle(rle) if is_crowd else [polygon],
                "area": float(mask_util.area(rle)),
                "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)],
                "iscrowd": int(is_crowd),
            })  # fmt: skip

        copies = 1 + rng.poisson(1.0, n)
        true_boxes = np.repeat(boxes, copies, axis=0)
        true_boxes = true_boxes + rng.normal(0.0, 0.1, true_boxes.shape) * true_boxes[:, [2, 3, 2, 3]]
        true_categories = np.repeat(categories, copies)
        relabel = rng.random(len(true_categories)) < 0.1
        true_categories[relabel] = rng.integers(1, num_categories + 1, int(relabel.sum()))
        num_false = max(dets_per_image - len(true_boxes), 0)
        det_boxes = np.concatenate([true_boxes, _random_boxes(rng, num_false, width, height, median_side=50.0)])
        det_categories = np.concatenate([true_categories, rng.integers(1, num_categories + 1, num_false)])
        scores = np.concatenate([rng.uniform(0.3, 1.0, len(true_boxes)), rng.uniform(0.0, 0.6, num_false)])
        # Clip to the image as a detector's boxes are, then keep the top detections.
        x0 = np.clip(det_boxes[:, 0], 0, width)
        y0 = np.clip(det_boxes[:, 1], 0, height)
        x1 = np.clip(det_boxes[:, 0] + np.maximum(det_boxes[:, 2], 1.0), 0, width)
        y1 = np.clip(det_boxes[:, 1] + np.maximum(det_boxes[:, 3], 1.0), 0, height)
        det_boxes = np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)
        keep = np.argsort(-scores, kind="stable")[:dets_per_image]
        rles = mask_util.frPyObjects(_ellipse_polygons(rng, det_boxes[keep]), height, width)
        for i, rle in zip(keep, rles):
            results.append({
                "image_id": image_id,
                "category_id": int(det_categories[i]),
                "bbox": [round(float(v), 2) for v in det_boxes[i]],
                "score": round(float(scores[i]), 5),
                "segmentation": {"counts": rle["counts"].decode("ascii"), "size": list(rle["size"])},
            })  # fmt: skip

    categories = [{"id": c, "name": f"category_{c}", "supercategory": "thing"} for c in range(1, num_categories + 1)]
    return {"images": images, "annotations": annotations, "categories": categories}, results
