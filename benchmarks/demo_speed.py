#!/usr/bin/env python3
"""Seconds per training step of the demo against the main job it shortens, in fresh
processes taking turns on the same machine.

    python benchmarks/demo_speed.py --rounds 3 --iters 150

Each round trains the main job (``configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``: float32,
64 RoIs per image) and the demo (``..._sgd_bs8_5min.yaml``: bfloat16 where the CPU has it, 32
RoIs per image) for ``--iters`` steps each, in a new process each, without evaluation, and
reads Detectron2's per-step ``time`` from ``metrics.json`` after the first ``--skip`` steps
(start-up, first allocations). Prints each run's median seconds per step, the demo's speed-up
in each round (main / demo) and the spread over rounds. Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "main job": os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml"),
    "demo": os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8_5min.yaml"),
}


def seconds_per_step(config: str, iters: int, skip: int, workdir: str) -> float:
    """Median of the logged per-step times of a fresh ``iters``-step run of ``config``."""
    out = os.path.join(workdir, os.path.basename(config))
    cmd = [sys.executable, "-m", "largedet.engine.train_net", "--config", config,
           "SOLVER.MAX_ITER", str(iters), "SOLVER.CHECKPOINT_PERIOD", str(10 * iters),
           "LOG_PERIOD", "10", "DATASETS.TEST", "()", "OUTPUT_DIR", out]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"{config}: training failed (exit {proc.returncode}):\n{tail}")
    times = []
    with open(os.path.join(out, "metrics.json")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("iteration", -1) >= skip and "time" in record:
                times.append(record["time"])
    if not times:
        raise RuntimeError(f"{config}: no step times after step {skip} in metrics.json")
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=150, help="steps per run")
    parser.add_argument("--skip", type=int, default=30, help="first steps left out")
    args = parser.parse_args(argv)
    if args.iters <= args.skip:
        parser.error("--iters must be larger than --skip")
    speedups, per_config = [], {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            round_times = {}
            for name, config in CONFIGS.items():
                round_dir = os.path.join(workdir, str(r))  # a fresh run each round
                round_times[name] = seconds_per_step(config, args.iters, args.skip, round_dir)
                per_config[name].append(round_times[name])
            speedups.append(round_times["main job"] / round_times["demo"])
            print(
                f"round {r + 1}: main job {round_times['main job']:.3f} s/step, demo "
                f"{round_times['demo']:.3f} s/step, speed-up {speedups[-1]:.2f}x",
                flush=True,
            )
    for name, values in per_config.items():
        print(f"{name}: {min(values):.3f}-{max(values):.3f} s/step (median {statistics.median(values):.3f})")
    print(f"speed-up (main job / demo): {min(speedups):.2f}-{max(speedups):.2f}x "
          f"over {args.rounds} rounds (median {statistics.median(speedups):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
