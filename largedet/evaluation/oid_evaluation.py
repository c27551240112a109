"""The Open Images Challenge object detection metric: mAP at IoU 0.5, in numpy.

Rules (those of the official challenge evaluation):

a. Hierarchy. Every ground-truth box also counts for each ancestor of its class;
   positive image-level labels are propagated to the ancestors, verified-negative
   ones to the descendants. Detections are never expanded (a detector is expected
   to output every level itself).
b. Verified classes. A class is evaluated on an image only if the image has a
   positive or verified-negative image-level label for it (after propagation) or
   a ground-truth box of it; other detections of it on that image are ignored.
c. Regular matching. Per image and class, detections in descending score order
   (ties in input order). Each takes the regular (not group-of) box of highest
   IoU among all of them, matched or not (ties: the earlier box). If that IoU
   >= 0.5 and the box is not yet matched, the detection is a true positive and
   the box matched; if the box is already matched, the detection is not a true
   positive, even when another unmatched box overlaps it by IoU >= 0.5.
d. Group-of boxes. Every detection that is not a true positive of rule (c) (a
   duplicate included) takes the group-of box of its class with the largest
   intersection over the detection's area (ties: the earlier box); if that ratio
   is >= 0.5, the detection is absorbed by the box: removed, neither true nor
   false positive. A group-of box's score is the highest score absorbed by it,
   starting at 0; a box of score > 0 is one true positive with that score (so a
   box that absorbed only detections of score 0 counts nothing). Every group-of
   box counts as ground truth: an undetected one is a false negative.
e. Every other detection (not a true positive, not absorbed) is a false positive.

Per class, all images together: detections and group-of true positives sorted by
descending score (ties keep their input order), precision and recall at every
rank, and AP = the area under the precision-recall curve after making precision
monotonically non-increasing (for each rank, the highest precision at that or any
later rank): the "all points" interpolation of Open Images and PASCAL VOC 2010+,
AP = sum over true positives of (1 / num_ground_truth) * interpolated precision.
The ground truth count of a class is its regular plus group-of boxes; a class
without any is left out of the mean (AP NaN), a class with boxes but no detection
has AP 0.

Boxes are ``(XMin, YMin, XMax, YMax)`` in normalised coordinates; areas are
continuous (no +1).

The implementation is vectorised: pairwise overlaps are computed for all
(detection, box) pairs of the same image and class at once (in bounded blocks).
Since a detection's box in rule (c) does not depend on earlier matches, rule (c)
needs no loop: a regular box is matched by the first detection, in score order,
whose best box it is, and that detection alone is a true positive of it. One
million detections take seconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from largedet.data.openimages import (
    ClassHierarchy,
    OpenImagesAnnotations,
    concat_ranges,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DETECTION_COLUMNS",
    "IOU_THRESHOLD",
    "OIDDetections",
    "OIDGroundTruth",
    "OIDResult",
    "average_precision",
    "evaluate_detections",
    "expand_detections",
    "expand_ground_truth",
]

# IoU of a true positive, and intersection over detection area of a detection
# absorbed by a group-of box: the challenge's 0.5.
IOU_THRESHOLD = 0.5
DETECTION_COLUMNS = ("ImageID", "LabelName", "Score", "XMin", "XMax", "YMin", "YMax")
# Bound on the (detection, box) pairs whose overlaps are computed at once.
_PAIR_BLOCK = 1 << 22


@dataclass(frozen=True)
class OIDGroundTruth:
    """Boxes and image-level labels of images ``0 .. len(image_ids) - 1``.

    Class indices are in ``[0, num_classes)`` (the class-descriptions vocabulary).
    """

    image_ids: np.ndarray  # (I,) ImageIDs (bytes or str)
    box_images: np.ndarray  # (N,) int64 image index
    boxes: np.ndarray  # (N, 4) float64 XMin, YMin, XMax, YMax
    box_labels: np.ndarray  # (N,) int64 class index
    box_is_group_of: np.ndarray  # (N,) bool
    label_images: np.ndarray  # (M,) int64 image index
    label_classes: np.ndarray  # (M,) int64 class index
    label_is_positive: np.ndarray  # (M,) bool: verified present (else verified absent)
    num_classes: int

    @classmethod
    def from_annotations(
        cls, ann: OpenImagesAnnotations, image_indices: Optional[np.ndarray] = None
    ) -> "OIDGroundTruth":
        """The ground truth of ``ann``'s images ``image_indices`` (default all), as 0..L-1."""
        if image_indices is None:
            image_indices = np.arange(ann.num_images)
        image_indices = np.asarray(image_indices, dtype=np.int64)
        local = np.arange(len(image_indices), dtype=np.int64)
        box_counts = ann.box_offsets[image_indices + 1] - ann.box_offsets[image_indices]
        box_rows = concat_ranges(ann.box_offsets[image_indices], box_counts)
        label_counts = ann.label_offsets[image_indices + 1] - ann.label_offsets[image_indices]
        label_rows = concat_ranges(ann.label_offsets[image_indices], label_counts)
        return cls(
            image_ids=np.asarray(ann.image_ids)[image_indices],
            box_images=np.repeat(local, box_counts),
            boxes=np.asarray(ann.boxes, dtype=np.float64)[box_rows],
            box_labels=np.asarray(ann.box_labels, dtype=np.int64)[box_rows],
            box_is_group_of=ann.box_is_group_of[box_rows],
            label_images=np.repeat(local, label_counts),
            label_classes=np.asarray(ann.label_classes, dtype=np.int64)[label_rows],
            label_is_positive=np.asarray(ann.label_confidence)[label_rows] == 1,
            num_classes=len(ann.label_names),
        )


@dataclass(frozen=True)
class OIDDetections:
    """Detections; ``images`` index the ground truth's images (-1: unknown image, ignored)."""

    images: np.ndarray  # (D,) int64
    boxes: np.ndarray  # (D, 4) float64 XMin, YMin, XMax, YMax
    scores: np.ndarray  # (D,) float64
    labels: np.ndarray  # (D,) int64 class index


@dataclass(frozen=True)
class OIDResult:
    """Per-class results; ``class_indices`` are the evaluated classes, in order."""

    class_indices: np.ndarray  # (C,) int64 class index
    average_precision: np.ndarray  # (C,) float64, NaN for a class without ground truth
    num_ground_truth: np.ndarray  # (C,) int64 regular + group-of boxes
    num_detections: np.ndarray  # (C,) int64 detections scored (not ignored, not absorbed)

    @property
    def mean_ap(self) -> float:
        """Mean AP over the classes with ground truth (NaN if there is none)."""
        valid = ~np.isnan(self.average_precision)
        return float(self.average_precision[valid].mean()) if valid.any() else float("nan")


def expand_ground_truth(gt: OIDGroundTruth, hierarchy: ClassHierarchy) -> OIDGroundTruth:
    """Rule (a): boxes and positive labels copied to ancestors, negatives to descendants."""
    if hierarchy.num_classes != gt.num_classes:
        raise ValueError(
            f"the hierarchy has {hierarchy.num_classes} classes, the ground truth {gt.num_classes}"
        )
    rows, box_labels = hierarchy.expand_up(gt.box_labels)
    pos = np.flatnonzero(gt.label_is_positive)
    neg = np.flatnonzero(~gt.label_is_positive)
    pos_rows, pos_labels = hierarchy.expand_up(gt.label_classes[pos])
    neg_rows, neg_labels = hierarchy.expand_down(gt.label_classes[neg])
    return OIDGroundTruth(
        image_ids=gt.image_ids,
        box_images=gt.box_images[rows],
        boxes=gt.boxes[rows],
        box_labels=box_labels,
        box_is_group_of=gt.box_is_group_of[rows],
        label_images=np.concatenate(
            [gt.label_images[pos][pos_rows], gt.label_images[neg][neg_rows]]
        ),
        label_classes=np.concatenate([pos_labels, neg_labels]),
        label_is_positive=np.concatenate(
            [np.ones(len(pos_rows), bool), np.zeros(len(neg_rows), bool)]
        ),
        num_classes=gt.num_classes,
    )


def expand_detections(det: OIDDetections, hierarchy: ClassHierarchy) -> OIDDetections:
    """Each detection also output for every ancestor class, with the same box and score.

    Not part of the metric (rule (a): detections are not expanded). It is the
    post-processing a detector trained on leaf labels needs to be scored at every
    level of the hierarchy.
    """
    rows, labels = hierarchy.expand_up(det.labels)
    return OIDDetections(det.images[rows], det.boxes[rows], det.scores[rows], labels)


def _intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    width = np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0])
    height = np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1])
    return np.clip(width, 0, None) * np.clip(height, 0, None)


def _area(a: np.ndarray) -> np.ndarray:
    return (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])


def _iou(det: np.ndarray, gt: np.ndarray) -> np.ndarray:
    inter = _intersection(det, gt)
    union = _area(det) + _area(gt) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _ioa(det: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Intersection over the area of the detection."""
    inter = _intersection(det, gt)
    area = _area(det)
    return np.divide(inter, area, out=np.zeros_like(inter), where=area > 0)


def _candidate_pairs(
    det_keys: np.ndarray,
    det_boxes: np.ndarray,
    gt_keys: np.ndarray,
    gt_boxes: np.ndarray,
    overlap: Callable[[np.ndarray, np.ndarray], np.ndarray],
    threshold: float,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (detection, box) pairs of equal key whose overlap >= threshold.

    ``gt_keys`` must be sorted. Returns (det index, gt index, overlap), by detection.
    """
    lo = np.searchsorted(gt_keys, det_keys, side="left")
    counts = np.searchsorted(gt_keys, det_keys, side="right") - lo
    ends = np.cumsum(counts)
    out_d, out_g, out_v = [], [], []
    start = 0
    while start < len(det_keys):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + _PAIR_BLOCK, side="right")))
        d = np.repeat(np.arange(start, stop), counts[start:stop])
        g = concat_ranges(lo[start:stop], counts[start:stop])
        v = overlap(det_boxes[d], gt_boxes[g])
        keep = v >= threshold
        out_d.append(d[keep])
        out_g.append(g[keep])
        out_v.append(v[keep])
        start = stop
    if not out_d:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(out_d), np.concatenate(out_g), np.concatenate(out_v)


def _first_of_runs(values: np.ndarray) -> np.ndarray:
    """Mask of the first element of each run of equal consecutive values."""
    mask = np.ones(len(values), dtype=bool)
    mask[1:] = values[1:] != values[:-1]
    return mask


def _match(
    gt_keys: np.ndarray,
    gt_boxes: np.ndarray,
    gt_group_of: np.ndarray,
    det_keys: np.ndarray,
    det_boxes: np.ndarray,
    det_scores: np.ndarray,
    threshold: float,
) -> Tuple[np.ndarray, np.ndarray]:
    """Rules (c) to (e) on detections and boxes keyed by (image, class).

    Returns:
        det_status: (D,) int8: 1 true positive, 0 false positive, -1 absorbed by a
            group-of box.
        group_score: (N,) float64: for a group-of box, the highest score absorbed by
            it, 0 if none (and for regular boxes); it is a true positive if > 0.
    """
    num_det = len(det_keys)
    # Sorted by (image, class), then descending score, then input order: within a
    # key, a smaller index is an earlier detection.
    order = np.lexsort((np.arange(num_det), -det_scores, det_keys))
    keys, boxes, scores = det_keys[order], det_boxes[order], det_scores[order]

    # Rule (c). Only pairs of IoU >= threshold are kept: the highest of them is the
    # detection's best box over all regular boxes whenever that best IoU counts.
    regular = np.flatnonzero(~gt_group_of)
    regular = regular[np.argsort(gt_keys[regular], kind="stable")]
    best_d, best_g = _best_box(
        *_candidate_pairs(keys, boxes, gt_keys[regular], gt_boxes[regular], _iou, threshold)
    )
    # best_d is ascending: the first detection of each best box, in score order,
    # matches it; the later ones are not true positives.
    o = np.argsort(best_g, kind="stable")
    is_tp = np.zeros(num_det, dtype=bool)
    is_tp[best_d[o][_first_of_runs(best_g[o])]] = True

    # Rule (d): every other detection, against the group-of boxes.
    group = np.flatnonzero(gt_group_of)
    group = group[np.argsort(gt_keys[group], kind="stable")]
    rest = np.flatnonzero(~is_tp)
    absorbed_d, absorbed_g = _best_box(
        *_candidate_pairs(keys[rest], boxes[rest], gt_keys[group], gt_boxes[group], _ioa, threshold)
    )
    absorbed_d = rest[absorbed_d]
    group_score = np.zeros(len(gt_keys))
    np.maximum.at(group_score, group[absorbed_g], scores[absorbed_d])

    status = is_tp.astype(np.int8)
    status[absorbed_d] = -1
    det_status = np.empty(num_det, dtype=np.int8)
    det_status[order] = status
    return det_status, group_score


def _best_box(
    pair_d: np.ndarray, pair_g: np.ndarray, overlap: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """Each detection's box of largest overlap among its pairs (ties: the smaller
    box index). Returns (detection, box), by ascending detection."""
    o = np.lexsort((pair_g, -overlap, pair_d))
    pair_d, pair_g = pair_d[o], pair_g[o]
    first = _first_of_runs(pair_d)
    return pair_d[first], pair_g[first]


def average_precision(scores: np.ndarray, is_tp: np.ndarray, num_ground_truth: int) -> float:
    """AP of one class: all-points interpolation (see the module docstring).

    Args:
        scores: (K,) scores of the scored entries (detections and group-of hits).
        is_tp: (K,) bool.
        num_ground_truth: boxes of the class; 0 gives NaN.
    """
    if num_ground_truth == 0:
        return float("nan")
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return _average_precision_sorted(np.asarray(is_tp, dtype=bool)[order], num_ground_truth)


def _average_precision_sorted(is_tp: np.ndarray, num_ground_truth: int) -> float:
    if len(is_tp) == 0:
        return 0.0
    true_positives = np.cumsum(is_tp)
    precision = true_positives / np.arange(1, len(is_tp) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    return float(envelope[is_tp].sum() / num_ground_truth)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    values = np.sort(values)
    return values[_first_of_runs(values)]


def _isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``values`` in ``sorted_set`` (searched in sorted order, which is much faster)."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    order = np.argsort(values, kind="stable")
    pos = np.minimum(np.searchsorted(sorted_set, values[order]), len(sorted_set) - 1)
    out = np.empty(len(values), dtype=bool)
    out[order] = sorted_set[pos] == values[order]
    return out


def evaluate_detections(
    gt: OIDGroundTruth,
    detections: OIDDetections,
    *,
    hierarchy: Optional[ClassHierarchy] = None,
    class_indices: Optional[Sequence[int]] = None,
    iou_threshold: float = IOU_THRESHOLD,
) -> OIDResult:
    """The Open Images Challenge metric (module docstring) of ``detections``.

    Args:
        gt: the ground truth, not yet expanded.
        detections: detections on ``gt``'s images.
        hierarchy: the class hierarchy for rule (a); None evaluates the labels as
            they are.
        class_indices: the classes to evaluate (default all ``gt.num_classes``);
            ground truth and detections of other classes are left out after the
            expansion.
        iou_threshold: IoU of a match and intersection over detection area of a
            group-of match.
    """
    num_classes = gt.num_classes
    if len(detections.labels) and not (
        0 <= detections.labels.min() and detections.labels.max() < num_classes
    ):
        raise ValueError(f"detection labels must be class indices in [0, {num_classes})")
    if hierarchy is not None:
        gt = expand_ground_truth(gt, hierarchy)
    if class_indices is None:
        class_indices = np.arange(num_classes)
    class_indices = np.asarray(class_indices, dtype=np.int64)
    evaluated = np.zeros(num_classes, dtype=bool)
    evaluated[class_indices] = True

    keep = evaluated[gt.box_labels]
    gt_labels = gt.box_labels[keep]
    gt_keys = gt.box_images[keep] * num_classes + gt_labels
    verified = _sorted_unique(
        np.concatenate([gt.label_images * num_classes + gt.label_classes, gt_keys])
    )

    det_keys = detections.images * num_classes + detections.labels
    valid = (
        (detections.images >= 0) & evaluated[detections.labels] & _isin_sorted(det_keys, verified)
    )
    valid = np.flatnonzero(valid)
    det_labels = detections.labels[valid]
    det_scores = np.asarray(detections.scores, dtype=np.float64)[valid]
    status, group_score = _match(
        gt_keys,
        np.asarray(gt.boxes, dtype=np.float64)[keep],
        gt.box_is_group_of[keep],
        det_keys[valid],
        np.asarray(detections.boxes, dtype=np.float64)[valid],
        det_scores,
        iou_threshold,
    )
    scored = status >= 0
    hit = group_score > 0
    labels = np.concatenate([det_labels[scored], gt_labels[hit]])
    scores = np.concatenate([det_scores[scored], group_score[hit]])
    is_tp = np.concatenate([status[scored] == 1, np.ones(int(hit.sum()), dtype=bool)])

    num_gt = np.bincount(gt_labels, minlength=num_classes)
    num_det = np.bincount(det_labels[scored], minlength=num_classes)
    order = np.lexsort((-scores, labels))
    labels, is_tp = labels[order], is_tp[order]
    starts = np.searchsorted(labels, class_indices, side="left")
    stops = np.searchsorted(labels, class_indices, side="right")
    ap = np.array(
        [
            _average_precision_sorted(is_tp[s:e], int(num_gt[c])) if num_gt[c] else np.nan
            for c, s, e in zip(class_indices.tolist(), starts.tolist(), stops.tolist())
        ],
        dtype=np.float64,
    )
    logger.info(
        "Open Images metric: %d of %d detections scored (%d on unverified classes or unknown "
        "images ignored, %d absorbed by group-of boxes), %d classes with ground truth",
        int(scored.sum()),
        len(detections.labels),
        len(detections.labels) - len(valid),
        int((status == -1).sum()),
        int(np.count_nonzero(num_gt[class_indices])),
    )
    return OIDResult(class_indices, ap, num_gt[class_indices], num_det[class_indices])
