#!/usr/bin/env python3
"""Evaluate a COCO results file: prints the 12 COCO metrics, then ``AP: <percent>``.

    python tools/coco_eval.py --gt instances_val.json --dt coco_instances_results.json \
        [--iou-type segm] [--impl auto|faster|pycocotools]

The implementation that computed the numbers is named on stderr. The command line is
``largedet.evaluation.coco_cli`` (installed: ``largedet-coco-eval``).
"""

import sys

from largedet.evaluation.coco_cli import main

if __name__ == "__main__":
    sys.exit(main())
