"""Images/s of Detectron2's training data loader on COCO-size JPEGs, by number of loader
workers, and the loader cores one GPU needs.

Writes ``--images`` generated COCO-size JPEGs with their COCO instances file
(``benchmarks/synthetic_coco.py``: COCO's frequent sizes, about 640 x 480; photo-like
content, about 150 KB each at quality 90; 7.4 boxes per image of 80 categories), registered
as ``synthetic_coco_train`` through ``DATASETS.COCO_JSONS``. Then, in this process, one
image at a time over ``--single-images`` images: the JPEG decode alone (Detectron2's
``read_image``), the decode and the config's training augmentations (resize, flip), and the
whole standard ``DatasetMapper`` of the config (those, the image as a tensor, the boxes as
``Instances``), so that the reader sees where a loader core's time goes. Then, for each
``--workers`` count W, Detectron2's ``build_detection_train_loader`` with that mapper (W
worker processes; 0: this process), ``--ims-per-batch`` images per batch, the config's
aspect-ratio grouping: after ``--warmup-images-per-worker`` x W images (the workers' start
and the first prefetched images), ``--images-per-worker`` x W images (rounded up to whole
batches) are timed; the rate is images over wall-clock seconds, the rate per worker that
over W, and the CPU time per image that the workers spent (warm-up included, read once they
have exited).

With ``--train-images-per-s T`` (a training speed in images/s on one GPU) it prints the
loader workers one GPU needs to feed T: T over the per-worker rate at the largest W
measured (all workers busy at once, as beside a GPU), and the smallest W measured whose rate
reaches T. The config (default ``configs/r50_fpn_bs16_sgd.yaml``, Faster R-CNN R50-FPN with
Detectron2's augmentations: shortest edge one of 640-800, at most 1333, horizontal flip)
takes trailing ``KEY VALUE`` overrides (``INPUT.MIN_SIZE_TRAIN (800,)``, or a smaller input
for a dry run). ``--max-seconds`` bounds the measuring (counted from the start of ``main``,
after the imports): at the limit the worker count under way keeps the images it has, marked
partial, and the figures so far are printed.

    python benchmarks/loader_speed.py [--images 512] [--workers 1 2 4 8]
        [--ims-per-batch 2] [--images-per-worker 120] [--warmup-images-per-worker 8]
        [--single-images 64] [--train-images-per-s T] [--max-seconds S] [KEY VALUE ...]

On a 16-core GPU machine, at most ``--max-seconds`` after the imports (plus 5 s where a
loader hangs)::

    python benchmarks/loader_speed.py --images 512 --workers 1 2 4 8 16 \\
        --images-per-worker 150 --single-images 64 --train-images-per-s 40 --max-seconds 45

The last line of the output is ``GPU-CHECK-FIGURES {json}``, one line of JSON with the keys

    cpu, cpu_count, cpus_usable   the processor's name, the machine's logical CPUs and those
                                  this process may run on
    config, min_size_train, max_size_train, ims_per_batch   what was loaded, and how
    images, jpeg_kb               JPEGs written and their mean size in KB
    decode_images_per_s, decode_ms        the JPEG decode alone, one process
    mapper_images_per_s, mapper_ms        the whole DatasetMapper, one process
    augment_images_per_s, augment_ms      the decode and the augmentations (resize, flip)
    decode_share, augment_share   decode_ms / mapper_ms, (augment_ms - decode_ms) / mapper_ms
    workers                       the worker counts measured (all or part)
    train_images_per_s            --train-images-per-s (null without it)
    workers_per_gpu               T / the per-worker rate at the largest W measured (null
                                  without T)
    cpu_cores_per_gpu             T x the CPU time per image at that W (null without T)
    min_workers_for_train         the smallest W measured whose rate reaches T (null: none,
                                  or no T)
    timed_out                     true where --max-seconds cut a count short or left one out
    wall_s                        seconds from the start of main to the figures
and per worker count W (the key ends in ``_w<W>``):
    images_w<W>, requested_w<W>   images timed, and asked for (equal unless partial)
    seconds_w<W>                  the timed wall-clock seconds
    images_per_s_w<W>             images_w<W> / seconds_w<W>
    images_per_s_per_worker_w<W>  that over W (over 1 for W = 0: this process)
    cpu_ms_per_image_w<W>         the workers' CPU time per image, warm-up included (this
                                  process's for W = 0)
    partial_w<W>                  true where the limit cut the count short
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import math
import os
import platform
import resource
import sys
import tempfile
import time

from detectron2.data import (
    DatasetMapper,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.data import transforms as T
from detectron2.data.detection_utils import build_augmentation, read_image

from largedet.config.validate import ConfigError
from largedet.engine import largedet_argument_parser, setup_cfg
from synthetic_coco import INSTANCES_JSON, write_synthetic_coco
from time_guard import TimeGuard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "r50_fpn_bs16_sgd.yaml")
COCO_DATASET = "synthetic_coco_train"


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_process_rates(dicts: list, mapper, cfg, count: int, guard: TimeGuard) -> dict:
    """Images/s, in this process, of the JPEG decode alone, of the decode and the training
    augmentations (``build_augmentation``: resize, flip), and of the whole mapper, over the
    first ``count`` images of ``dicts`` (cycled), after one untimed image. The three take
    turns image by image, so that a machine that slows down slows all three alike."""
    augmentations = T.AugmentationList(build_augmentation(cfg, is_train=True))

    def decode(d):
        return read_image(d["file_name"], format=cfg.INPUT.FORMAT)

    stages = {
        "decode": decode,
        "augment": lambda d: augmentations(T.AugInput(decode(d))),
        "mapper": lambda d: mapper(copy.deepcopy(d)),
    }
    seconds = dict.fromkeys(stages, 0.0)
    for i in range(max(count, 1) + 1):
        d = dicts[i % len(dicts)]
        for name, work in stages.items():
            start = time.perf_counter()
            work(d)
            if i:  # the first image is untimed
                seconds[name] += time.perf_counter() - start
        if i and guard.left() <= 0:
            break
    figures = {}
    for name in stages:
        figures[f"{name}_images_per_s"] = round(i / seconds[name], 2)
        figures[f"{name}_ms"] = round(1000 * seconds[name] / i, 3)
    figures["decode_share"] = round(figures["decode_ms"] / figures["mapper_ms"], 3)
    figures["augment_share"] = round((figures["augment_ms"] - figures["decode_ms"]) / figures["mapper_ms"], 3)
    return figures


def loader_rate(dicts: list, mapper, cfg, workers: int, args, guard: TimeGuard) -> dict:
    """Time ``workers`` loader workers (the script's arguments say how many images); returns
    their figures, the keys ending in ``_w<W>``."""
    loader = build_detection_train_loader(
        dicts, mapper=mapper, total_batch_size=args.ims_per_batch,
        aspect_ratio_grouping=cfg.DATALOADER.ASPECT_RATIO_GROUPING, num_workers=workers,
    )  # fmt: skip
    cores = max(workers, 1)
    warmup = math.ceil(args.warmup_images_per_worker * cores / args.ims_per_batch)
    batches = math.ceil(args.images_per_worker * cores / args.ims_per_batch)
    cpu_before, process_before = children_cpu_s(), time.process_time()
    stream = iter(loader)
    images_seen = 0
    for _ in range(warmup):
        images_seen += len(next(stream))
    requested = batches * args.ims_per_batch
    images, partial, start = 0, False, time.perf_counter()
    for _ in range(batches):
        images += len(next(stream))
        if images < requested and guard.left() <= 0:
            partial = True
            break
    seconds = time.perf_counter() - start
    images_seen += images
    del stream, loader
    gc.collect()  # the workers exit and are waited for: their CPU time is counted
    w = f"_w{workers}"
    figures = {
        f"images{w}": images,
        f"requested{w}": requested,
        f"seconds{w}": round(seconds, 3),
        f"images_per_s{w}": round(images / seconds, 2),
        f"images_per_s_per_worker{w}": round(images / seconds / cores, 2),
        f"partial{w}": partial,
    }
    cpu = children_cpu_s() - cpu_before if workers else time.process_time() - process_before
    figures[f"cpu_ms_per_image{w}"] = round(1000 * cpu / images_seen, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="a largedet yacs config")
    parser.add_argument("--images", type=int, default=512, help="COCO-size JPEGs written")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2, 4, 8], metavar="W",
        help="loader worker counts measured, one after the other (0: this process)",
    )  # fmt: skip
    parser.add_argument("--ims-per-batch", type=int, default=2, help="images per batch (per GPU)")
    parser.add_argument(
        "--images-per-worker", type=int, default=120, help="images timed per worker, per worker count"
    )
    parser.add_argument(
        "--warmup-images-per-worker", type=int, default=8, help="untimed images per worker first"
    )
    parser.add_argument(
        "--single-images", type=int, default=64, help="images decoded and mapped in this process"
    )
    parser.add_argument(
        "--train-images-per-s", type=float, default=None, metavar="T",
        help="a training speed in images/s on one GPU: the loader workers it needs are printed",
    )  # fmt: skip
    parser.add_argument(
        "--max-seconds", type=float, default=0.0,
        help="stop measuring after this many seconds and print the figures so far (0: no limit)",
    )  # fmt: skip
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides")
    args = parser.parse_args()
    guard = TimeGuard(args.max_seconds, grace=5.0)  # the loops stop at the end; the alarm if they hang
    logging.disable(logging.INFO)  # Detectron2's loader logs its dataset

    figures: dict = {"cpu": cpu_name(), "cpu_count": os.cpu_count()}
    figures.update(cpus_usable=len(os.sched_getaffinity(0)), workers=[])
    with tempfile.TemporaryDirectory(prefix="loader_speed_") as tmp, guard:
        data = os.path.join(tmp, "coco")
        entry = [COCO_DATASET, os.path.join(data, INSTANCES_JSON), data]
        opts = [
            "DATASETS.COCO_JSONS", json.dumps([entry]), "DATASETS.TRAIN", f"('{COCO_DATASET}',)",
            "SOLVER.IMS_PER_BATCH", str(args.ims_per_batch), "SOLVER.IMS_PER_DEVICE", "0",
        ]  # fmt: skip
        # the loader alone: no model, so no device to check
        cfg_args = ["--config-file", args.config, "MODEL.DEVICE", "cpu", *args.opts, *opts]
        try:
            cfg = setup_cfg(largedet_argument_parser().parse_args(cfg_args), log=False)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        _, jpeg_bytes = write_synthetic_coco(data, args.images, jobs=min(figures["cpus_usable"], 16))
        figures.update({
            "config": os.path.relpath(args.config, ROOT),
            "min_size_train": list(cfg.INPUT.MIN_SIZE_TRAIN),
            "max_size_train": cfg.INPUT.MAX_SIZE_TRAIN,
            "ims_per_batch": args.ims_per_batch,
            "images": args.images,
            "jpeg_kb": round(jpeg_bytes / args.images / 1000, 1),
        })  # fmt: skip
        dicts = get_detection_dataset_dicts(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        )
        mapper = DatasetMapper(cfg, is_train=True)
        figures.update(one_process_rates(dicts, mapper, cfg, args.single_images, guard))
        for workers in args.workers:
            if guard.left() <= 0:
                break
            figures.update(loader_rate(dicts, mapper, cfg, workers, args, guard))
            figures["workers"].append(workers)
    report(args, figures, guard)


def report(args, figures: dict, guard: TimeGuard) -> None:
    measured = figures["workers"]
    figures["train_images_per_s"] = args.train_images_per_s
    figures["workers_per_gpu"] = figures["cpu_cores_per_gpu"] = figures["min_workers_for_train"] = None
    if args.train_images_per_s and measured:
        per_worker = figures[f"images_per_s_per_worker_w{measured[-1]}"]
        figures["workers_per_gpu"] = round(args.train_images_per_s / per_worker, 3)
        cpu_s = figures[f"cpu_ms_per_image_w{measured[-1]}"] / 1000
        figures["cpu_cores_per_gpu"] = round(args.train_images_per_s * cpu_s, 3)
        enough = [w for w in measured if figures[f"images_per_s_w{w}"] >= args.train_images_per_s]
        figures["min_workers_for_train"] = min(enough) if enough else None
    figures["timed_out"] = guard.expired or len(measured) < len(args.workers) or any(
        figures[f"partial_w{w}"] for w in measured
    )
    figures["wall_s"] = round(guard.elapsed(), 1)

    print(
        f"{figures.get('config', args.config)} {' '.join(args.opts)}: {args.images} COCO-size JPEGs "
        f"({figures.get('jpeg_kb', '?')} KB each), shortest edge {figures.get('min_size_train')}, "
        f"at most {figures.get('max_size_train')}; {figures['cpu']}, {figures['cpus_usable']} of "
        f"{figures['cpu_count']} CPUs"
    )
    if "mapper_ms" in figures:
        print(
            f"  one process: decode {figures['decode_ms']:.1f} ms/image "
            f"({figures['decode_images_per_s']:.1f} images/s), with the augmentations "
            f"{figures['augment_ms']:.1f}, whole mapper {figures['mapper_ms']:.1f} ms/image "
            f"({figures['mapper_images_per_s']:.1f} images/s): decode {figures['decode_share']:.0%}, "
            f"augmentations {figures['augment_share']:.0%}, the rest (tensor, boxes) "
            f"{1 - figures['decode_share'] - figures['augment_share']:.0%}"
        )
    for w in measured:
        print(
            f"  {w:>2} worker(s): {figures[f'images_per_s_w{w}']:.1f} images/s, "
            f"{figures[f'images_per_s_per_worker_w{w}']:.1f} per worker, "
            f"{figures[f'cpu_ms_per_image_w{w}']:.1f} CPU-ms/image ({figures[f'images_w{w}']} images "
            f"in {figures[f'seconds_w{w}']:.2f} s{', partial' if figures[f'partial_w{w}'] else ''})"
        )
    if figures["workers_per_gpu"] is not None:
        enough = figures["min_workers_for_train"]
        print(
            f"  {args.train_images_per_s:g} images/s per GPU needs {figures['workers_per_gpu']:.1f} "
            f"loader workers at {measured[-1]} workers' per-worker rate "
            f"({figures['cpu_cores_per_gpu']:.1f} cores by their CPU time); "
            + (f"the fewest measured that reach it: {enough}" if enough is not None
               else "no count measured reaches it")
        )
    if figures["timed_out"]:
        print("  stopped by --max-seconds")
    print("GPU-CHECK-FIGURES " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
