#!/usr/bin/env python3
"""Training clips per second of the video study's dataset with and without
``INPUT.VIDEO.DECODED_CACHE_MB``, in fresh processes.

    python projects/video/benchmarks/decoded_cache.py [--processes 3] [--videos 512] [--passes 3]
        [--csv projects/video/benchmarks/results/decoded_cache.csv --load "what else ran"]

Each of ``--processes`` fresh processes (one torch thread) builds the study's training set
(``projects/video/configs/study/Base-Study-TSM-R18w16-8f-32px.yaml``: 16 frames of 40 x 40,
OpenCV; generated once under the dataset cache) twice over its first ``--videos`` videos:
without a cache, and with one large enough to hold them. It times ``--passes`` passes of
training samples over each in alternation (uncached pass, cached pass, ...), so that a
change of load hits both alike; the cached set's first pass decodes every video whole,
the later ones read memory. Every cached clip is compared with the uncached one drawn from
the same seed: the script stops if one differs.

Printed per process: ms per clip without the cache (median pass), with it in its first pass
and in its later passes (median), and the ratio uncached / cached-later; then the median and
range of each over the processes. The last line is ``DECODED-CACHE-FIGURES {json}``. With
``--csv`` each process appends a row (date, CPU, torch, ``--load``: what else the machine
ran); projects/video/README.md's table is generated from that CSV
(``python study/study_report.py``).
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
    "passes", "uncached_ms", "cached_first_ms", "cached_ms", "ratio", "cache_mb",
]  # fmt: skip
STUDY_CONFIG = os.path.join(
    os.path.dirname(HERE), "configs", "study", "Base-Study-TSM-R18w16-8f-32px.yaml"
)


def _child(videos: int, passes: int) -> dict:
    import numpy as np
    import torch
    from detectron2.config import get_cfg

    import largedet_video  # noqa: F401  (imports largedet first)
    from largedet_video import add_video_config
    from largedet_video.data.build import build_video_dataset, get_video_records
    from largedet_video.data.builtin import register_video_datasets

    torch.set_num_threads(1)
    cfg = add_video_config(get_cfg())
    cfg.merge_from_file(STUDY_CONFIG)
    register_video_datasets(cfg)
    records = get_video_records(cfg.DATASETS.TRAIN)[:videos]
    cfg.INPUT.VIDEO.DECODED_CACHE_MB = 0
    plain = build_video_dataset(cfg, cfg.DATASETS.TRAIN, True)
    shapes = cfg.DATASETS.MOVING_SHAPES
    video_bytes = shapes.NUM_FRAMES * shapes.HEIGHT * shapes.WIDTH * 3
    cfg.INPUT.VIDEO.DECODED_CACHE_MB = 2 * videos * video_bytes // 2**20 + 1  # room to spare
    cached = build_video_dataset(cfg, cfg.DATASETS.TRAIN, True)
    plain.records = cached.records = records

    def one_pass(ds, seed):
        np.random.seed(seed)
        start = time.perf_counter()
        clips = [ds[i]["clip"] for i in range(len(records))]
        return (time.perf_counter() - start) / len(records) * 1e3, clips

    plain_ms, cached_ms = [], []
    for p in range(passes):
        ms, a = one_pass(plain, seed=p)
        plain_ms.append(ms)
        ms, b = one_pass(cached, seed=p)
        cached_ms.append(ms)
        if not all(torch.equal(x, y) for x, y in zip(a, b)):
            raise SystemExit(f"pass {p}: a cached clip differs from the file's")
    return {
        "torch": torch.__version__,
        "uncached_ms": statistics.median(plain_ms),
        "cached_first_ms": cached_ms[0],
        "cached_ms": statistics.median(cached_ms[1:]),
        "cache_mb": cached.cache.bytes / 2**20,
        "videos": len(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--videos", type=int, default=512)
    parser.add_argument("--passes", type=int, default=3, help="at least 2")
    parser.add_argument("--csv", help="append one row per process to this CSV")
    parser.add_argument("--load", default="", help="what else the machine ran (the CSV's load column)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.passes < 2:
        parser.error("--passes: at least 2 (the first cached pass decodes)")
    if args.child:
        print(json.dumps(_child(args.videos, args.passes)))
        return
    runs = []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in range(args.processes):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--videos", str(args.videos),
             "--passes", str(args.passes)],
            env=env, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        run = json.loads(out.strip().splitlines()[-1])
        run["ratio"] = run["uncached_ms"] / run["cached_ms"]
        runs.append(run)
        print(
            f"process {k + 1}: {run['videos']} videos; ms per clip: uncached {run['uncached_ms']:.2f}, "
            f"cached first pass {run['cached_first_ms']:.2f}, later {run['cached_ms']:.3f} "
            f"(x{run['ratio']:.1f}); cache {run['cache_mb']:.0f} MB",
            flush=True,
        )
    if args.csv:
        _append_rows(args.csv, runs, args)
    figures = {"processes": len(runs), "videos": args.videos, "passes": args.passes}
    for key in ("uncached_ms", "cached_first_ms", "cached_ms", "ratio"):
        values = [r[key] for r in runs]
        figures[key] = statistics.median(values)
        figures[key + "_range"] = [min(values), max(values)]
        print(f"{key}: median {figures[key]:.3f}, range {min(values):.3f}-{max(values):.3f}")
    print("DECODED-CACHE-FIGURES " + json.dumps(figures))


def _append_rows(path: str, runs: list, args) -> None:
    machine = cpu_class()
    date = datetime.date.today().isoformat()
    append_rows(path, [{
        "date": date, **machine, "torch": run["torch"], "load": args.load, "process": k,
        "videos": run["videos"], "passes": args.passes,
        **{key: f"{run[key]:.4g}" for key in ("uncached_ms", "cached_first_ms", "cached_ms", "ratio")},
        "cache_mb": f"{run['cache_mb']:.1f}",
    } for k, run in enumerate(runs, 1)], CSV_FIELDS)  # fmt: skip


if __name__ == "__main__":
    main()
