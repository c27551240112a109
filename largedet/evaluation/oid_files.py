"""The Open Images Challenge metric on files: detections read from and written to CSV,
per-class results written, and :func:`evaluate_files`, the metric
(:mod:`largedet.evaluation.oid_evaluation`) of a detections file against an annotated split."""

from __future__ import annotations

import csv
import logging
from itertools import repeat
from typing import Optional, Sequence, Tuple

import numpy as np

from largedet.data.openimages import (
    ChunkedCsvReader,
    OpenImagesAnnotations,
    check_box_coordinates,
    load_openimages_ground_truth,
    parse_floats,
    parse_indices,
)

from .oid_evaluation import (
    DETECTION_COLUMNS,
    OIDDetections,
    OIDGroundTruth,
    OIDResult,
    evaluate_detections,
)

__all__ = ["evaluate_files", "read_detections_csv", "write_detections_csv", "write_per_class_csv"]

logger = logging.getLogger(__name__)


def read_detections_csv(
    path: str, label_names: Sequence[str], image_ids: np.ndarray
) -> OIDDetections:
    """Read detections (columns :data:`DETECTION_COLUMNS`, by header name).

    Args:
        label_names: the vocabulary; a LabelName outside it is an error.
        image_ids: (I,) sorted bytes ImageIDs of the ground truth; detections on
            other images get image index -1 (ignored by the metric).

    Raises:
        OpenImagesFormatError: a missing column, an unknown LabelName, a
            non-numeric Score, a coordinate outside [0, 1], XMin > XMax or
            YMin > YMax, naming the file, line and column.
    """
    label_table = {name.encode(): k for k, name in enumerate(label_names)}
    image_table = {
        i if isinstance(i, bytes) else str(i).encode(): k
        for k, i in enumerate(np.asarray(image_ids).tolist())
    }
    parts = []
    with ChunkedCsvReader(path, DETECTION_COLUMNS) as reader:
        for lines, cols in reader:
            labels = parse_indices(
                cols["LabelName"],
                label_table,
                reader.path,
                lines,
                "LabelName",
                "unknown LabelName {value!r}: not in the class descriptions",
            )
            scores = parse_floats(cols["Score"], reader.path, lines, "Score")
            xmin, xmax, ymin, ymax = (
                parse_floats(cols[c], reader.path, lines, c)
                for c in ("XMin", "XMax", "YMin", "YMax")
            )
            check_box_coordinates(xmin, xmax, ymin, ymax, reader.path, lines)
            images = np.fromiter(
                map(image_table.get, cols["ImageID"], repeat(-1)), np.int64, len(lines)
            )
            parts.append(
                (
                    images,
                    np.stack([xmin, ymin, xmax, ymax], axis=1),
                    scores,
                    labels.astype(np.int64),
                )
            )
    if not parts:
        return OIDDetections(
            np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)
        )
    det = OIDDetections(*(np.concatenate(p) for p in zip(*parts)))
    unknown = int((det.images < 0).sum())
    if unknown:
        logger.warning(
            "%s: %d detections on images without ground truth are ignored", path, unknown
        )
    return det


def write_detections_csv(
    path: str, detections: OIDDetections, image_ids: np.ndarray, label_names: Sequence[str]
) -> None:
    """Write detections in the :data:`DETECTION_COLUMNS` format (see :func:`read_detections_csv`)."""
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in np.asarray(image_ids).tolist()]
    with open(path, "w", newline="") as f:
        f.write(",".join(DETECTION_COLUMNS) + "\n")
        f.writelines(
            f"{ids[i]},{label_names[c]},{s:.6g},{b[0]:.6f},{b[2]:.6f},{b[1]:.6f},{b[3]:.6f}\n"
            for i, c, s, b in zip(
                detections.images.tolist(),
                detections.labels.tolist(),
                detections.scores.tolist(),
                detections.boxes.tolist(),
            )
        )


def write_per_class_csv(
    path: str, result: OIDResult, label_names: Sequence[str], display_names: Sequence[str]
) -> None:
    """One row per evaluated class: LabelName, DisplayName, AP (empty without ground
    truth), NumGroundTruth, NumDetections."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["LabelName", "DisplayName", "AP", "NumGroundTruth", "NumDetections"])
        for c, ap, n_gt, n_det in zip(
            result.class_indices.tolist(),
            result.average_precision.tolist(),
            result.num_ground_truth.tolist(),
            result.num_detections.tolist(),
        ):
            writer.writerow(
                [label_names[c], display_names[c], "" if np.isnan(ap) else f"{ap:.6f}", n_gt, n_det]
            )


def evaluate_files(
    boxes_csv: str,
    class_descriptions_csv: str,
    detections_csv: str,
    image_labels_csv: Optional[str] = None,
    hierarchy_json: Optional[str] = None,
) -> Tuple[OIDResult, OpenImagesAnnotations]:
    """The metric of a detections CSV against the official ground-truth files, every
    class of ``class_descriptions_csv`` evaluated. The files are parsed, not cached
    (:func:`~largedet.data.openimages.load_openimages_ground_truth` with
    ``use_cache=False``).

    Returns:
        (result, annotations): the annotations give the class names of the result.
    """
    ground_truth = load_openimages_ground_truth(
        boxes_csv,
        class_descriptions_csv,
        image_labels_csv,
        hierarchy_json or None,
        use_cache=False,
    )
    ann = ground_truth.annotations
    detections = read_detections_csv(detections_csv, ann.label_names, ann.image_ids)
    result = evaluate_detections(
        OIDGroundTruth.from_annotations(ann),
        detections,
        hierarchy=ground_truth.hierarchy,
        class_indices=ground_truth.class_indices,
    )
    return result, ann
