#!/usr/bin/env python3
"""The video demo's top-1 and time, run by run, in fresh processes.

    python projects/video/benchmarks/demo_runs.py --runs 2 \\
        [--csv projects/video/benchmarks/results/demo_runs.csv --load "what else ran"]

Each run is ``projects/video/train.py --config-file CFG`` in a new process (training, then
the 10-clip x 3-crop test of the 100 validation videos), into a temporary output folder, for
each of ``--configs`` (default: the demo, TSM, and the same network without the shift, TSN)
in turn, ``--runs`` times. Read from the run: the training wall clock less evaluation (the
trainer's ``run_summary.json``), seconds per step, the whole command's wall clock (dataset
generation on first use included) and top-1. With ``--csv`` each run appends a row (date,
CPU, torch, ``--load``); projects/video/README.md's table is generated from
``projects/video/benchmarks/results/demo_runs.csv`` (``python study/study_report.py``).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VIDEO_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(VIDEO_DIR))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from demo_speed import append_rows, cpu_class  # noqa: E402  (the CPU's name, family/model, instruction sets)

from largedet.launch.run_summary import read_run_summary, training_seconds  # noqa: E402
from largedet_video.evaluation import last_classification_metric  # noqa: E402

CONFIGS = (
    "projects/video/configs/tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml",
    "projects/video/configs/tsn_r18w32_8f_moving_shapes_adamw_bs16.yaml",
)
CSV_FIELDS = [
    "date", "cpu", "cpu_family_model", "isa", "cores", "torch", "load", "config", "run", "iterations",
    "training_s", "s_per_step", "whole_s", "top1",
]  # fmt: skip
REPORT_SET = "moving_shapes_val"


def run_summary_figures(output_dir: str) -> dict:
    """Training seconds (wall clock less evaluation, over the invocations:
    :func:`~largedet.launch.run_summary.training_seconds`), steps and top-1 of the finished run
    in ``output_dir``."""
    summary = read_run_summary(output_dir) or {}
    training = training_seconds(output_dir)
    if summary.get("status") != "finished" or training is None:
        raise RuntimeError(f"{output_dir}: the run did not finish (run_summary.json status {summary.get('status')!r})")
    with open(os.path.join(output_dir, "metrics.json")) as f:
        top1 = last_classification_metric([json.loads(line) for line in f if line.strip()], REPORT_SET)
    if top1 is None:
        raise RuntimeError(f"{output_dir}/metrics.json: no {REPORT_SET} top-1")
    return {"iterations": summary["iterations"], "training_s": round(training, 1), "top1": round(top1, 2)}


def run_demo(config: str, output_dir: str) -> dict:
    start = time.perf_counter()
    cmd = [sys.executable, os.path.join(VIDEO_DIR, "train.py"), "--config-file", os.path.join(ROOT, config),
           "OUTPUT_DIR", output_dir]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    figures = run_summary_figures(output_dir)
    figures["whole_s"] = time.perf_counter() - start
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), help="paths from the repository root")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--csv", help="append one row per run to this CSV")
    parser.add_argument("--load", default="", help="what else the machine ran (the CSV's load column)")
    args = parser.parse_args()
    for config in args.configs:
        if not os.path.isfile(os.path.join(ROOT, config)):
            parser.error(f"--configs: no file {config}")
    import torch

    machine = {"date": datetime.date.today().isoformat(), **cpu_class(), "torch": torch.__version__, "load": args.load}
    for k in range(1, args.runs + 1):
        for config in args.configs:
            with tempfile.TemporaryDirectory() as out:
                r = run_demo(config, out)
            row = {**machine, "config": config, "run": k, "iterations": r["iterations"],
                   "training_s": f"{r['training_s']:.1f}", "s_per_step": f"{r['training_s'] / r['iterations']:.4f}",
                   "whole_s": f"{r['whole_s']:.1f}", "top1": f"{r['top1']:.2f}"}  # fmt: skip
            print(f"run {k} {os.path.basename(config)}: top-1 {r['top1']:.1f}%, training {r['training_s']:.0f} s, "
                  f"whole {r['whole_s']:.0f} s", flush=True)  # fmt: skip
            if args.csv:
                append_rows(args.csv, [row], CSV_FIELDS)


if __name__ == "__main__":
    main()
