#!/usr/bin/env python3
"""Seconds of one multigrid precise-BN pass with a decoded-video cache of its own (each pass
decodes its clips) and with the training loader's, already warm, in fresh processes.

    python projects/video/benchmarks/precise_bn_cache.py [--processes 3] [--videos 4096]
        [--iters 200] [--batch 16] [--passes 2]
        [--csv projects/video/benchmarks/results/precise_bn_cache.csv --load "what else ran"]

Each of ``--processes`` fresh processes (one torch thread) builds the video study's model and
training set (``projects/video/configs/study/Base-Study-TSM-R18w16-8f-32px.yaml``, ``--videos``
training videos, generated once under the dataset cache), reads every training video once
into the training set's cache (the first epoch of a run does that), then times
``--passes`` precise-BN passes of each kind in alternation (own cache, shared cache, ...):
Detectron2's ``PreciseBN`` over ``--iters`` base-shape batches of ``--batch`` clips from the
loader multigrid's trainer builds for it (``build_video_train_loader``, no workers), with a
new cache of its own (the trainer before it shared the training loader's) or with the
training set's. Printed per process: seconds per pass of each (median) and their ratio; then
the median and range over the processes; the last line is ``PRECISE-BN-CACHE-FIGURES {json}``.
With ``--csv`` each process appends a row (date, CPU, torch, ``--load``); projects/video/README.md's
table is generated from that CSV (``python study/study_report.py``).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from demo_speed import append_rows, cpu_class  # noqa: E402  (the CPU's name, family/model, instruction sets)

CSV_FIELDS = [
    "date", "cpu", "cpu_family_model", "isa", "cores", "torch", "load", "process", "videos",
    "iters", "batch", "passes", "own_cache_s", "shared_cache_s", "ratio",
]  # fmt: skip
STUDY_CONFIG = os.path.join(os.path.dirname(HERE), "configs", "study", "Base-Study-TSM-R18w16-8f-32px.yaml")


def _child(videos: int, iters: int, batch: int, passes: int) -> dict:
    import torch
    from detectron2.config import get_cfg
    from detectron2.engine.hooks import PreciseBN
    from detectron2.modeling import build_model

    import largedet_video  # noqa: F401  (imports largedet first, registers the models)
    from largedet_video import add_video_config
    from largedet_video.data.build import build_video_train_loader
    from largedet_video.data.builtin import register_video_datasets

    torch.set_num_threads(1)
    cfg = add_video_config(get_cfg())
    cfg.merge_from_file(STUDY_CONFIG)
    cfg.DATASETS.MOVING_SHAPES.NUM_TRAIN = videos
    cfg.DATASETS.MOVING_SHAPES.NUM_VAL = 4096  # the tsm4k task's: the study's generated set
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.MODEL.DEVICE = "cpu"
    register_video_datasets(cfg)
    training = build_video_train_loader(cfg, batch).dataset
    for i in range(len(training)):  # a first epoch: every video decoded into the cache
        training[i]
    model = build_model(cfg)
    model.train()

    def one_pass(shared: bool) -> float:
        loader = build_video_train_loader(cfg, batch)
        if shared:
            loader.dataset.cache = training.cache
        start = time.perf_counter()
        PreciseBN(0, model, loader, iters).update_stats()
        return time.perf_counter() - start

    own, shared = [], []
    for _ in range(passes):
        own.append(one_pass(False))
        shared.append(one_pass(True))
    return {"torch": torch.__version__, "videos": len(training), "own_cache_s": statistics.median(own),
            "shared_cache_s": statistics.median(shared)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--videos", type=int, default=4096, help="training videos (the study's 4096)")
    parser.add_argument("--iters", type=int, default=200, help="batches per pass (TEST.PRECISE_BN.NUM_ITER)")
    parser.add_argument("--batch", type=int, default=16, help="clips per batch (the base per-device batch)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--csv", help="append one row per process to this CSV")
    parser.add_argument("--load", default="", help="what else the machine ran (the CSV's load column)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = ["--videos", str(args.videos), "--iters", str(args.iters), "--batch", str(args.batch),
             "--passes", str(args.passes)]  # fmt: skip
    if args.child:
        print(json.dumps(_child(args.videos, args.iters, args.batch, args.passes)))
        return
    runs = []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--child", *sizes], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        run = json.loads(out.strip().splitlines()[-1])
        run["ratio"] = run["own_cache_s"] / run["shared_cache_s"]
        runs.append(run)
        print(f"process {k + 1}: {run['videos']} videos, {args.iters} batches of {args.batch}; seconds a pass: "
              f"own cache {run['own_cache_s']:.2f}, shared {run['shared_cache_s']:.2f} (x{run['ratio']:.2f})",
              flush=True)  # fmt: skip
    if args.csv:
        machine, date = cpu_class(), datetime.date.today().isoformat()
        append_rows(args.csv, [{
            "date": date, **machine, "torch": run["torch"], "load": args.load, "process": k,
            "videos": run["videos"], "iters": args.iters, "batch": args.batch, "passes": args.passes,
            **{key: f"{run[key]:.4g}" for key in ("own_cache_s", "shared_cache_s", "ratio")},
        } for k, run in enumerate(runs, 1)], CSV_FIELDS)  # fmt: skip
    figures = {"processes": len(runs), "videos": args.videos, "iters": args.iters, "batch": args.batch}
    for key in ("own_cache_s", "shared_cache_s", "ratio"):
        values = [r[key] for r in runs]
        figures[key], figures[key + "_range"] = statistics.median(values), [min(values), max(values)]
        print(f"{key}: median {figures[key]:.3f}, range {min(values):.3f}-{max(values):.3f}")
    print("PRECISE-BN-CACHE-FIGURES " + json.dumps(figures))


if __name__ == "__main__":
    main()
