#!/usr/bin/env python3
"""The GPU check: largedet's CUDA tests and GPU benchmarks in one go, on a fresh GPU machine.

    python benchmarks/gpu_check.py [--output output/gpu_check] [--steps NAME,...] [--force]
        [--budget SECONDS] [--wheels .whl] [--archive FILE.tar.gz]
    python benchmarks/gpu_check.py --dry-run      # the same steps on tiny sizes, on the CPU
    python benchmarks/gpu_check.py --list         # the steps and their commands
    python benchmarks/gpu_check.py --fetch-wheels .whl   # here, with the package registry

Each step runs one of the repository's scripts in a subprocess, from the repository root,
under its own time limit (each under 10 minutes, about 34 minutes together), its stdout and
stderr in ``OUTPUT/<step>.log``. After every step ``OUTPUT/results.json`` is rewritten (per
step: the command, exit code, status, wall-clock seconds, the figures parsed from its output,
the device as ``torch.cuda.get_device_name`` names it, torch and CUDA versions, the date; and
the environment) with ``OUTPUT/summary.md``, a table for ``benchmarks/RESULTS.md``. A
failing step does not stop the others. Run again on the same ``OUTPUT``, the steps already
recorded as passed (exit code 0 and every expected figure found) are skipped (``--force``
runs them again), so a suite split over several commands, by ``--steps`` or by ``--budget``
(no step starts after that many seconds, and a running one is stopped there), continues
where it stopped. ``--archive`` packs the results and logs into one file after every step,
for machines that give back only a few files.

The steps (``--list`` prints their commands):

    cuda-tests             pytest -m cuda tests/cuda: AMP with accumulation, the optimizers'
                           CUDA paths, SyncBN in an NCCL group, sub-batch BN, R-CNN training
    optimizer-step         benchmarks/optimizer_step.py: PMD-LAMB, eager and compiled, vs fused
                           AdamW (<= 1.1x)
    train-throughput-bf16  benchmarks/train_throughput.py, R50-FPN at 800x1067, AMP bfloat16,
                           SGD vs PMD-LAMB, K=1 vs K=8, profiled
    train-throughput-fp16  the same with AMP float16 (gradient scaler)
    video-throughput       projects/video/benchmarks/throughput.py: TSM vs TSN vs I3D, 8x224^2
    multigrid              projects/video/benchmarks/multigrid.py: speed-up at 1.5x and 1.0x epochs

Nothing is downloaded while it runs: the models start from random weights and the data
are generated. The children find the repository (and ``projects/video``) on PYTHONPATH.
Packages a plain CUDA image lacks (Detectron2, fvcore, PyAV, ...) are installed, only where
they do not import, from the wheels in ``--wheels`` into a private folder (``--site``) that
goes on the children's PYTHONPATH; ``--fetch-wheels DIR`` puts those wheels in DIR on a
machine with the package registry (the versions installed there; pure-Python packages that
are published only as source are built into wheels). With ``--dry-run`` every step runs its
script on the CPU on tiny sizes, so that the suite cannot rot between GPU runs
(``tests/benchmarks/test_gpu_check.py`` does that).

This file is the command line; the steps, the reading of their output, the machine's
packages and the records are the modules of ``benchmarks/gpu_checks/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

from gpu_checks.environment import REPO, fetch_wheels, set_up
from gpu_checks.running import (
    DRY_RUN_TIMEOUT_S,
    MIN_STEP_SECONDS,
    archive,
    load_results,
    now,
    print_tail,
    run_step,
    summary_markdown,
    write_json,
)
from gpu_checks.steps import STEP_NAMES, STEPS


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--output",
        help="results folder (default: output/gpu_check, or output/gpu_check_dry with --dry-run)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="every step on tiny sizes, on the CPU"
    )
    parser.add_argument("--steps", help=f"comma-separated subset of: {','.join(STEP_NAMES)}")
    parser.add_argument("--force", action="store_true", help="run steps already recorded as passed")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for this invocation (no step starts after; one running is stopped)",
    )
    parser.add_argument(
        "--wheels",
        default=os.path.join(REPO, ".whl"),
        help="wheels for packages that do not import (default: .whl)",
    )
    parser.add_argument(
        "--site",
        default=os.path.join(tempfile.gettempdir(), "largedet_gpu_check_site"),
        help="where those wheels are installed",
    )
    parser.add_argument("--archive", help="write OUTPUT's files into this .tar.gz after every step")
    parser.add_argument("--list", action="store_true", help="print the steps and their commands")
    parser.add_argument(
        "--fetch-wheels",
        metavar="DIR",
        help="download the wheels a plain CUDA image lacks into DIR, then exit",
    )
    parser.add_argument(
        "--python-version", default="3.12", help="of the GPU machine, for --fetch-wheels"
    )
    args = parser.parse_args()
    start = time.monotonic()
    args.output = os.path.abspath(
        args.output
        or os.path.join(REPO, "output", "gpu_check_dry" if args.dry_run else "gpu_check")
    )

    if args.fetch_wheels:
        fetch_wheels(args.fetch_wheels, args.python_version)
        return 0
    selected = list(STEPS)
    if args.steps:
        names = [n.strip() for n in args.steps.split(",") if n.strip()]
        unknown = sorted(set(names) - set(STEP_NAMES))
        if unknown:
            parser.error(f"unknown steps {unknown}; the steps: {', '.join(STEP_NAMES)}")
        selected = [s for s in STEPS if s.name in names]
    if args.list:
        for step in selected:
            command = step.args(args.dry_run, os.path.relpath(args.output, REPO))
            print(f"{step.name} ({step.timeout_s} s): {step.what}")
            print(f"    python {shlex.join(command)}")
        return 0

    os.makedirs(args.output, exist_ok=True)
    results_path = os.path.join(args.output, "results.json")
    results = load_results(results_path, args.dry_run)
    env, info = set_up(args)
    results.update(
        suite="largedet GPU check", dry_run=args.dry_run, environment=info, updated=now()
    )
    write_json(results_path, results)
    missing = info.get("missing", {})
    if "error" in info or {"largedet", "detectron2"} & set(missing):
        print(f"The steps cannot run here: {json.dumps(info, indent=2)}", file=sys.stderr)
        return 2
    if missing:
        print(f"Not importable (the steps that need them will fail): {json.dumps(missing)}")
    if not args.dry_run and not info.get("cuda_available"):
        print("No CUDA device: run with --dry-run on a machine without a GPU", file=sys.stderr)
        return 2
    print(
        f"{info['device']}, torch {info['torch']} (CUDA {info['cuda']}), Python {info['python']}; "
        f"results in {args.output}"
    )

    deadline = start + args.budget if args.budget else None
    failed = 0
    for step in selected:
        previous = results["steps"].get(step.name)
        if previous and previous["status"] == "passed" and not args.force:
            print(f"[{step.name}] passed on {previous['date']}: skipped (--force runs it again)")
            continue
        timeout = step.timeout_s if not args.dry_run else DRY_RUN_TIMEOUT_S
        budget_stop = False
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < MIN_STEP_SECONDS:
                print(f"[{step.name}] not started: {left:.0f} s of the budget left")
                continue
            if left < timeout:
                timeout, budget_stop = left, True
        print(f"[{step.name}] {step.what} (limit {timeout:.0f} s) ...", flush=True)
        record = run_step(step, args, env, info, timeout, budget_stop)
        results["steps"][step.name] = record
        results["updated"] = now()
        write_json(results_path, results)
        with open(os.path.join(args.output, "summary.md"), "w") as f:
            f.write(summary_markdown(results))
        if args.archive:
            archive(args.output, args.archive)
        figures = json.dumps(record["figures"])
        print(f"[{step.name}] {record['status']} in {record['wall_s']:.0f} s; figures: {figures}")
        if record["status"] != "passed":
            failed += 1
            print(f"[{step.name}] last lines of {record['log']}:")
            print_tail(os.path.join(args.output, record["log"]))
    with open(os.path.join(args.output, "summary.md"), "w") as f:
        f.write(summary_markdown(results))
    if args.archive:
        archive(args.output, args.archive)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
