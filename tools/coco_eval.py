#!/usr/bin/env python3
"""Evaluate a COCO results file: prints the 12 COCO metrics, then ``AP: <percent>``.

    python tools/coco_eval.py --gt instances_val.json --dt coco_instances_results.json \
        [--iou-type segm] [--impl auto|faster|pycocotools]

The implementation that computed the numbers is named on stderr.
"""

import argparse
import sys

from largedet.evaluation.coco import COCO_EVAL_IMPLS, CocoInputError, evaluate_coco_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gt", required=True, help="COCO instances JSON (ground truth)")
    parser.add_argument("--dt", required=True, help="COCO results JSON (a list of detections)")
    parser.add_argument("--iou-type", default="bbox", choices=["bbox", "segm"])
    parser.add_argument(
        "--impl",
        default="auto",
        choices=["auto", *COCO_EVAL_IMPLS],
        help="faster: faster-coco-eval (pycocotools' numbers, much faster); pycocotools: "
        "pycocotools' COCOeval; auto (default): faster-coco-eval where it is installed",
    )
    args = parser.parse_args(argv)
    try:
        result = evaluate_coco_results(args.gt, args.dt, args.iou_type, impl=args.impl)
    except (CocoInputError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"evaluated by {result.impl}", file=sys.stderr)
    print(result.summary, end="")
    print(f"AP: {result.ap_percent:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
