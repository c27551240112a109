#!/usr/bin/env python3
"""Evaluate a COCO results file: prints the 12 COCO metrics, then ``AP: <percent>``.

    python tools/coco_eval.py --gt instances_val.json --dt coco_instances_results.json [--iou-type segm]
"""

import argparse
import sys

from largedet.evaluation.coco import CocoInputError, evaluate_coco_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gt", required=True, help="COCO instances JSON (ground truth)")
    parser.add_argument("--dt", required=True, help="COCO results JSON (a list of detections)")
    parser.add_argument("--iou-type", default="bbox", choices=["bbox", "segm"])
    args = parser.parse_args(argv)
    try:
        result = evaluate_coco_results(args.gt, args.dt, args.iou_type)
    except CocoInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.summary, end="")
    print(f"AP: {result.ap_percent:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
