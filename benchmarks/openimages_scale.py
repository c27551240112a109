"""Time and peak memory of OpenImages at scale: parse and register box rows, score detections.

Generates, in a work folder, OpenImages-format files of the V6 train proportions
(8.4 boxes and 5 image-level labels per image, 601 classes in a random hierarchy,
20% group-of boxes) with ``--rows`` box rows, one tiny JPEG per image, and
``--detections`` detections (half near ground-truth boxes, half anywhere). Each
phase then runs in a fresh process, so that its peak resident memory is its own:

- parse: ``load_openimages_annotations`` with an empty cache (parse + cache write)
- cached: the same call again (memory-mapped cache)
- register: ``register_openimages`` + ``DatasetCatalog.get`` on a warm annotation
  cache, reading every image's size (cold size cache), then making every dataset dict
- evaluate: read the detections CSV, then ``evaluate_detections`` with the hierarchy

Prints one line per phase: seconds, peak RSS, and peak RSS above the process's RSS
after its imports (torch and Detectron2 alone take a few hundred MB).

    python benchmarks/openimages_scale.py [--rows 1000000] [--detections 1000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

BOXES_PER_IMAGE = 14_610_229 / 1_743_042  # V6 train
LABELS_PER_IMAGE = 5.0
NUM_CLASSES = 601
GROUP_OF_FRACTION = 0.2


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(workdir: str, rows: int, num_detections: int, seed: int = 0) -> None:
    """Write classes, hierarchy, boxes, image-level labels, images and detections."""
    rng = np.random.default_rng(seed)
    labels = [f"/m/b{k:04d}" for k in range(NUM_CLASSES)]
    with open(os.path.join(workdir, "classes.csv"), "w") as f:
        f.writelines(f"{l},Class {k}\n" for k, l in enumerate(labels))
    # A random forest: 60 classes under the root, each other class under an earlier one.
    parent = [-1] * 60 + [int(rng.integers(0, k)) for k in range(60, NUM_CLASSES)]
    children = {k: [] for k in range(NUM_CLASSES)}
    for k, p in enumerate(parent):
        if p >= 0:
            children[p].append(k)

    def node(k):
        out = {"LabelName": labels[k]}
        if children[k]:
            out["Subcategory"] = [node(c) for c in children[k]]
        return out

    with open(os.path.join(workdir, "hierarchy.json"), "w") as f:
        json.dump({"LabelName": "/m/0bl9f", "Subcategory": [node(k) for k in range(60)]}, f)

    num_images = int(round(rows / BOXES_PER_IMAGE))
    # Distinct 16-hex-digit IDs (multiplication by an odd number is a bijection mod 2**62).
    ids = sorted(f"{i * 2654435761 % (1 << 62):016x}" for i in range(num_images))
    box_image = np.sort(rng.integers(0, num_images, rows))
    box_label = rng.zipf(1.3, rows) % NUM_CLASSES
    x = np.sort(rng.random((rows, 2)), axis=1)
    y = np.sort(rng.random((rows, 2)), axis=1)
    flags = (rng.random((rows, 5)) < [0.3, 0.2, GROUP_OF_FRACTION, 0.05, 0.01]).astype(int)
    with open(os.path.join(workdir, "boxes.csv"), "w") as f:
        f.write(
            "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax,IsOccluded,IsTruncated,IsGroupOf,IsDepiction,IsInside\n"
        )
        f.writelines(
            f"{ids[i]},xclick,{labels[c]},1,{x0:.6f},{x1:.6f},{y0:.6f},{y1:.6f},{a},{b},{g},{d},{e}\n"
            for i, c, (x0, x1), (y0, y1), (a, b, g, d, e) in zip(
                box_image.tolist(), box_label.tolist(), x.tolist(), y.tolist(), flags.tolist()
            )
        )
    num_labels = int(num_images * LABELS_PER_IMAGE)
    label_image = np.sort(rng.integers(0, num_images, num_labels))
    with open(os.path.join(workdir, "labels.csv"), "w") as f:
        f.write("ImageID,Source,LabelName,Confidence\n")
        f.writelines(
            f"{ids[i]},verification,{labels[c]},{p}\n"
            for i, c, p in zip(
                label_image.tolist(),
                (rng.zipf(1.3, num_labels) % NUM_CLASSES).tolist(),
                (rng.random(num_labels) < 0.7).astype(int).tolist(),
            )
        )
    images = os.path.join(workdir, "images")
    os.makedirs(images, exist_ok=True)
    from PIL import Image

    Image.new("RGB", (32, 24), (90, 120, 150)).save(os.path.join(images, "template.jpg"))
    with open(os.path.join(images, "template.jpg"), "rb") as f:
        jpeg = f.read()
    for i in ids:
        with open(os.path.join(images, i + ".jpg"), "wb") as f:
            f.write(jpeg)

    near, far = num_detections // 2, num_detections - num_detections // 2
    src = rng.integers(0, rows, near)
    jitter = rng.normal(0, 0.03, (near, 4))
    corner = rng.random((far, 2)) * 0.7
    size = 0.05 + rng.random((far, 2)) * 0.25
    dx = np.concatenate(
        [
            np.sort(np.clip(x[src] + jitter[:, :2], 0, 1), axis=1),
            np.stack([corner[:, 0], corner[:, 0] + size[:, 0]], axis=1),
        ]
    )
    dy = np.concatenate(
        [
            np.sort(np.clip(y[src] + jitter[:, 2:], 0, 1), axis=1),
            np.stack([corner[:, 1], corner[:, 1] + size[:, 1]], axis=1),
        ]
    )
    det_image = np.concatenate([box_image[src], rng.integers(0, num_images, far)])
    det_label = np.concatenate(
        [
            np.where(rng.random(near) < 0.7, box_label[src], rng.integers(0, NUM_CLASSES, near)),
            rng.integers(0, NUM_CLASSES, far),
        ]
    )
    with open(os.path.join(workdir, "detections.csv"), "w") as f:
        f.write("ImageID,LabelName,Score,XMin,XMax,YMin,YMax\n")
        f.writelines(
            f"{ids[i]},{labels[c]},{s:.6f},{x0:.6f},{x1:.6f},{y0:.6f},{y1:.6f}\n"
            for i, c, s, (x0, x1), (y0, y1) in zip(
                det_image.tolist(),
                det_label.tolist(),
                rng.random(num_detections).tolist(),
                dx.tolist(),
                dy.tolist(),
            )
        )


def run_phase(phase: str, workdir: str) -> dict:
    """One phase in this process; returns its measurements."""
    import largedet  # noqa: F401  (before detectron2)
    from detectron2.data import DatasetCatalog

    from largedet.data.openimages import (
        load_openimages_annotations,
        load_openimages_ground_truth,
        register_openimages,
    )
    from largedet.evaluation.oid_evaluation import OIDGroundTruth, evaluate_detections
    from largedet.evaluation.oid_files import read_detections_csv

    paths = {
        k: os.path.join(workdir, f)
        for k, f in (
            ("boxes", "boxes.csv"),
            ("classes", "classes.csv"),
            ("labels", "labels.csv"),
            ("hierarchy", "hierarchy.json"),
            ("detections", "detections.csv"),
            ("cache", "cache"),
        )
    }
    base = _rss_mb()
    start = time.perf_counter()
    info = {}
    if phase in ("parse", "cached"):
        ann = load_openimages_annotations(
            paths["boxes"], paths["classes"], paths["labels"], cache_dir=paths["cache"]
        )
        info = {"boxes": len(ann.boxes), "images": ann.num_images, "labels": len(ann.label_classes)}
        if phase == "parse":
            info["cache_mb"] = (
                sum(
                    os.path.getsize(os.path.join(r, f))
                    for r, _, fs in os.walk(paths["cache"])
                    for f in fs
                )
                / 2**20
            )
    elif phase == "register":
        register_openimages(
            "bench_oi",
            paths["boxes"],
            os.path.join(workdir, "images"),
            paths["classes"],
            paths["labels"],
            paths["hierarchy"],
            cache_dir=paths["cache"],
        )
        dataset = DatasetCatalog.get("bench_oi")
        loaded = time.perf_counter()
        annotations = sum(len(d["annotations"]) for d in dataset)
        info = {
            "images": len(dataset),
            "annotations": annotations,
            "load_s": loaded - start,
            "dicts_s": time.perf_counter() - loaded,
        }
    elif phase == "evaluate":
        ground_truth = load_openimages_ground_truth(
            paths["boxes"],
            paths["classes"],
            paths["labels"],
            paths["hierarchy"],
            cache_dir=paths["cache"],
        )
        ann = ground_truth.annotations
        t0 = time.perf_counter()
        det = read_detections_csv(paths["detections"], ann.label_names, ann.image_ids)
        t1 = time.perf_counter()
        result = evaluate_detections(
            OIDGroundTruth.from_annotations(ann), det, hierarchy=ground_truth.hierarchy
        )
        info = {
            "detections": len(det.scores),
            "read_s": t1 - t0,
            "evaluate_s": time.perf_counter() - t1,
            "mAP": result.mean_ap,
            "classes": int((result.num_ground_truth > 0).sum()),
        }
    return {"seconds": time.perf_counter() - start, "peak_mb": _peak_mb(), "base_mb": base, **info}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--detections", type=int, default=1_000_000)
    parser.add_argument(
        "--workdir", help="keep the generated files here (default: a temporary folder)"
    )
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.workdir)))
        return

    workdir = args.workdir or tempfile.mkdtemp(prefix="oi_bench_")
    os.makedirs(workdir, exist_ok=True)
    try:
        t = time.perf_counter()
        generate(workdir, args.rows, args.detections)
        print(
            f"generated {args.rows} box rows, {args.detections} detections in {time.perf_counter() - t:.1f} s"
        )
        shutil.rmtree(os.path.join(workdir, "cache"), ignore_errors=True)
        for phase in ("parse", "cached", "register", "evaluate"):
            out = (
                subprocess.run(
                    [sys.executable, __file__, "--phase", phase, "--workdir", workdir],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            extra = ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in r.items()
                if k not in ("seconds", "peak_mb", "base_mb")
            )
            print(
                f"{phase:9s} {r['seconds']:7.2f} s  peak RSS {r['peak_mb']:7.0f} MB "
                f"(+{r['peak_mb'] - r['base_mb']:.0f} MB over imports)  {extra}"
            )
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
