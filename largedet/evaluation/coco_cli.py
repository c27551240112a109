"""The command line of ``tools/coco_eval.py`` (installed: ``largedet-coco-eval``): a COCO
results file scored against its ground truth
(:func:`~largedet.evaluation.coco.evaluate_coco_results`).

    python tools/coco_eval.py --gt instances_val.json --dt coco_instances_results.json \\
        [--iou-type segm] [--impl auto|faster|pycocotools]

Prints the 12 COCO metrics, then ``AP: <percent>``: ``AP: n/a``, with a warning on stderr, for a
ground truth without annotations (AP undefined); ``AP: 0.000``, with another warning, for a
results file without detections (the model found nothing); the implementation that computed the numbers is named on
stderr. A file that cannot be read, or an entry that is not a detection,
is one line, ``error: ...``, exit status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from .coco import COCO_EVAL_IMPLS, CocoInputError, evaluate_coco_results

__all__ = ["coco_eval_argument_parser", "main"]


def coco_eval_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Evaluate a COCO results file: prints the 12 COCO metrics, then "
        "``AP: <percent>``."
    )
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = coco_eval_argument_parser().parse_args(argv)
    try:
        result = evaluate_coco_results(args.gt, args.dt, args.iou_type, impl=args.impl)
    except (CocoInputError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"evaluated by {result.impl}", file=sys.stderr)
    print(result.summary, end="")
    if math.isnan(result.ap_percent):
        print(
            f"warning: {args.gt}: no ground-truth annotation to score against (none, or only "
            "crowd regions): AP is undefined",
            file=sys.stderr,
        )
        print("AP: n/a")
    elif result.detections == 0:
        print(f"warning: {args.dt}: no detections (an empty list): the model found nothing, AP is 0",
              file=sys.stderr)  # fmt: skip
        print(f"AP: {result.ap_percent:.3f}")
    else:
        print(f"AP: {result.ap_percent:.3f}")
    return 0
