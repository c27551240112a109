#!/usr/bin/env python3
"""Score detections with the Open Images Challenge metric; ends with ``mAP@0.5: <fraction>``.

    python tools/oid_eval.py --boxes validation-annotations-bbox.csv \\
        --image-labels validation-annotations-human-imagelabels-boxable.csv \\
        --hierarchy bbox_labels_600_hierarchy.json \\
        --class-descriptions class-descriptions-boxable.csv \\
        --detections DET.csv [--per-class per_class_ap.csv]

DET.csv has the columns ImageID,LabelName,Score,XMin,XMax,YMin,YMax (normalised).
"""

import argparse
import logging
import sys

import largedet  # noqa: F401  (Detectron2 fallback before any detectron2 import)
from largedet.data.openimages import OpenImagesFormatError
from largedet.evaluation.oid_evaluation import evaluate_files, write_per_class_csv


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)
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
    print(
        f"classes with ground truth: {int((result.num_ground_truth > 0).sum())} of {len(result.class_indices)}"
    )
    print(f"mAP@0.5: {result.mean_ap:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
