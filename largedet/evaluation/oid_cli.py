"""The command line of ``tools/oid_eval.py``: a detections CSV scored with the Open Images
Challenge metric (:func:`~largedet.evaluation.oid_files.evaluate_files`).

    python tools/oid_eval.py --boxes validation-annotations-bbox.csv \\
        --image-labels validation-annotations-human-imagelabels-boxable.csv \\
        --hierarchy bbox_labels_600_hierarchy.json \\
        --class-descriptions class-descriptions-boxable.csv \\
        --detections DET.csv [--per-class per_class_ap.csv]

Prints the number of classes with ground truth, then ``mAP@0.5: <fraction>``; a file that
cannot be read or parsed is one line, ``error: <file>, line <n>, column <name>: <what>``,
exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..data.openimages import OpenImagesFormatError
from .oid_files import evaluate_files, write_per_class_csv

__all__ = ["main", "oid_eval_argument_parser"]


def oid_eval_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Score detections with the Open Images Challenge metric (mAP@0.5)"
    )
    parser.add_argument(
        "--boxes", required=True, help="ground-truth boxes (*-annotations-bbox.csv)"
    )
    parser.add_argument(
        "--image-labels", help="image-level labels (*-annotations-human-imagelabels-boxable.csv)"
    )
    parser.add_argument("--hierarchy", help="class hierarchy JSON (bbox_labels_600_hierarchy.json)")
    parser.add_argument(
        "--class-descriptions",
        required=True,
        help="LabelName,DisplayName CSV: the evaluated classes",
    )
    parser.add_argument(
        "--detections", required=True, help="ImageID,LabelName,Score,XMin,XMax,YMin,YMax CSV"
    )
    parser.add_argument("--per-class", metavar="OUT.csv", help="write the per-class APs here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = oid_eval_argument_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        result, ann = evaluate_files(
            args.boxes, args.class_descriptions, args.detections, args.image_labels, args.hierarchy
        )
    except (OpenImagesFormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.per_class:
        write_per_class_csv(args.per_class, result, ann.label_names, ann.display_names)
    with_ground_truth = int((result.num_ground_truth > 0).sum())
    print(f"classes with ground truth: {with_ground_truth} of {len(result.class_indices)}")
    print(f"mAP@0.5: {result.mean_ap:.6f}")
    return 0
