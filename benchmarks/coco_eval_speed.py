"""Time COCO box and mask evaluation at COCO val2017 scale: pycocotools against faster-coco-eval.

The data are generated (`benchmarks/synthetic_coco.py`, seeded):
at the default 5,000 images, COCO val2017's shape (about 37,000 objects with polygon masks,
about 1% crowd regions as uncompressed RLE, frequent COCO image sizes) and 100 detections per
image with boxes and RLE masks, as a Mask R-CNN's results on val2017. Each run evaluates as
largedet's ``COCOEvaluator`` does (ground-truth index, ``loadRes``, ``evaluate``,
``accumulate``, ``summarize``; for masks the results without ``bbox``, as Detectron2), on its
own copies of the annotation dicts (both implementations write into them). Runs are
interleaved (the order of the two implementations alternates between IoU types and rounds) so
that a shared machine's load affects both alike. Prints the wall-clock and process CPU seconds
(all threads; faster-coco-eval computes mask IoUs on up to 8 threads) of each, the speed-up,
and checks that the 12 metrics agree to 1e-6. pycocotools takes minutes per IoU type at the
full size on a small CPU: ``--images`` scales the data down.

    python benchmarks/coco_eval_speed.py [--images 5000] [--rounds 1] [--iou-types bbox segm]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import logging
import os
import platform
import statistics
import time

import numpy as np

from largedet.evaluation.coco import METRIC_NAMES, coco_eval_impl
from synthetic_coco import synthetic_coco_instances

logger = logging.getLogger("benchmarks.coco_eval_speed")

IMPLS = ("pycocotools", "faster")
TOLERANCE = 1e-6


def evaluate(impl, gt: dict, results: list, iou_type: str):
    """One evaluation as the COCOEvaluator runs it; returns (stats, wall s, CPU s)."""
    gt = {**gt, "annotations": [dict(a) for a in gt["annotations"]]}
    if iou_type == "segm":
        results = [{k: v for k, v in r.items() if k != "bbox"} for r in results]
    else:
        results = [dict(r) for r in results]
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = impl.coco()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        evaluator = impl.cocoeval(coco_gt, coco_gt.loadRes(results), iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return (
        np.asarray(evaluator.stats[: len(METRIC_NAMES)], dtype=np.float64),
        time.perf_counter() - wall,
        time.process_time() - cpu,
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000, help="images (COCO val2017: 5,000)")
    parser.add_argument("--dets-per-image", type=int, default=100, help="detections per image")
    parser.add_argument("--rounds", type=int, default=1, help="timed runs per implementation and IoU type")
    parser.add_argument("--iou-types", nargs="+", default=["bbox", "segm"], choices=["bbox", "segm"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    impls = {name: coco_eval_impl(name) for name in IMPLS}

    start = time.perf_counter()
    gt, results = synthetic_coco_instances(args.images, dets_per_image=args.dets_per_image, seed=args.seed)
    areas = np.array([a["area"] for a in gt["annotations"] if not a["iscrowd"]])
    logger.info(
        "%s UTC, %s (%d cores, load average %.1f), Python %s, %s, %s",
        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        _cpu_name(),
        os.cpu_count(),
        os.getloadavg()[0],
        platform.python_version(),
        impls["pycocotools"],
        impls["faster"],
    )
    logger.info(
        "data (seed %d, generated in %.0f s): %d images, %d objects (%d crowd; small/medium/large "
        "%.0f/%.0f/%.0f%%), %d detections",
        args.seed,
        time.perf_counter() - start,
        len(gt["images"]),
        len(gt["annotations"]),
        sum(a["iscrowd"] for a in gt["annotations"]),
        100 * np.mean(areas < 32**2),
        100 * np.mean((areas >= 32**2) & (areas < 96**2)),
        100 * np.mean(areas >= 96**2),
        len(results),
    )

    timings = {(t, name): [] for t in args.iou_types for name in IMPLS}
    stats = {}
    for r in range(args.rounds):
        for i, iou_type in enumerate(args.iou_types):
            order = IMPLS if (r + i) % 2 == 0 else IMPLS[::-1]
            for name in order:
                got, wall, cpu = evaluate(impls[name], gt, results, iou_type)
                timings[iou_type, name].append((wall, cpu))
                stats.setdefault((iou_type, name), got)
                logger.info(
                    "round %d %-4s %-11s %7.1f s wall %7.1f s CPU  AP %.4f", r, iou_type, name, wall, cpu, got[0]
                )

    logger.info(
        "%-5s %16s %16s %9s %17s %17s  %s",
        "iou",
        "pycocotools (s)",
        "faster (s)",
        "speed-up",
        "pycocotools CPU s",
        "faster CPU s",
        "max |stats diff|",
    )
    agree = True
    for iou_type in args.iou_types:
        wall = {name: statistics.median(w for w, _ in timings[iou_type, name]) for name in IMPLS}
        cpu = {name: statistics.median(c for _, c in timings[iou_type, name]) for name in IMPLS}
        diff = float(np.abs(stats[iou_type, "faster"] - stats[iou_type, "pycocotools"]).max())
        agree &= diff <= TOLERANCE
        logger.info(
            "%-5s %16.1f %16.1f %8.1fx %17.1f %17.1f  %.1e",
            iou_type,
            wall["pycocotools"],
            wall["faster"],
            wall["pycocotools"] / wall["faster"],
            cpu["pycocotools"],
            cpu["faster"],
            diff,
        )
    logger.info(
        "the 12 metrics %s to %g; total %.0f s",
        "agree" if agree else "DIFFER",
        TOLERANCE,
        time.perf_counter() - start,
    )
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
