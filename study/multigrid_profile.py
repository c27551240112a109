#!/usr/bin/env python3
"""Where a multigrid run's wall clock goes, beside the plain schedule's: short runs of the
video study's cells on the built-in moving-shapes videos, stage by stage and shape by shape.

    nice python study/multigrid_profile.py            # about 5 min, 1 core
    python study/multigrid_profile.py --task 64px --epochs 1 --num-train 256

Each schedule of ``--schedules`` is the study's cell (:func:`video_study.grid.plan_video_cell`
of the ``mg_time`` grid, or ``mg_time64`` with ``--task 64px``) at base batch ``--batch`` with
one batch per step (``SOLVER.IMS_PER_DEVICE`` = the batch: a step is one shape; the study's
accumulation with ``--per-device 16 --batch 128``), on
``--num-train`` training videos for ``--epochs`` epochs, tested once at the end on
``--num-val`` videos (the study's 10 clips x 3 crops): ``plain`` (the step LR schedule without
multigrid), ``multigrid`` (long and short cycles), ``long`` (the long cycle alone), ``short``
(the short cycle alone). Every run is ``projects/video/train.py`` in a fresh process, into
``--output-dir``/<schedule>; the tables are printed from its ``stage_times.json``
(:mod:`largedet_video.engine.stage_times`): seconds and share of the wall clock per stage
(training compute, data, the epoch starts' data, precise BN, evaluation, the rest), and per
shape its steps, seconds, median step and compute time and compute ms per million voxels
(clips x frames x height x width): equal across shapes where a step's cost follows its
shape. The share of precise BN and evaluation in a run this short is not the study's
(a fixed cost over few steps); the per-shape costs are the point.

``--json PATH`` also writes every schedule's summary.
"""

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

from largedet_video.engine.stage_times import format_stage_times, read_stage_times
from video_study.grid import VideoCell, build_video_grid, plan_video_cell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEDULES = {
    "plain": dict(lr_schedule="step"),
    "multigrid": dict(multigrid=True),
    "long": dict(multigrid=True, multigrid_short_cycle=False),
    "short": dict(multigrid=True, multigrid_long_cycle=False),
}
TASKS = {"32px": "mg_time", "64px": "mg_time64"}


def profile_plan(task: str, schedule: str, batch: int, num_train: int, num_val: int, epochs: float,
                 output_dir: str, precise_bn_iters: int, per_device: int = 0):  # fmt: skip
    """The overrides of ``schedule``'s study cell in miniature: ``num_train`` videos,
    ``epochs`` epochs (warm-up a quarter of them), ``per_device`` clips a batch (0: the
    whole batch, one batch per step), ``num_val`` test videos, no held-out split, no
    checkpoint before the end."""
    grid = build_video_grid(TASKS[task])
    grid = dataclasses.replace(
        grid, num_train=num_train, epochs=epochs, warmup_epochs=epochs / 4, ims_per_device=per_device or batch,
        holdout_set=None,
        extra_overrides=(
            "DATASETS.MOVING_SHAPES.NUM_TRAIN", str(num_train),
            "DATASETS.MOVING_SHAPES.NUM_VAL", str(num_val),
            "DATASETS.TEST", "('moving_shapes_val',)",
            "TEST.PRECISE_BN.NUM_ITER", str(precise_bn_iters),
            "SOLVER.CHECKPOINT_PERIOD", "100000",
            "LOG_PERIOD", "20",
        ),
    )  # fmt: skip
    plan = plan_video_cell(grid, VideoCell("sgd", batch, **SCHEDULES[schedule]), output_dir)
    return grid, plan


def run(grid, plan, output_dir: str, threads: int) -> float:
    """Train ``plan`` into ``output_dir`` (a fresh folder); the process's wall clock."""
    if os.path.exists(os.path.join(output_dir, "metrics.json")):
        raise SystemExit(f"{output_dir} holds a run already: give another --output-dir")
    os.makedirs(output_dir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "projects", "video", "train.py"),
           "--config-file", os.path.join(ROOT, grid.config), *plan.overrides]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    with open(os.path.join(output_dir, "profile_log.txt"), "w") as log:
        code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"{plan.cell.name}: exit {code}; see {output_dir}/profile_log.txt")
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", nargs="+", default=["plain", "short", "multigrid"], choices=sorted(SCHEDULES))
    parser.add_argument("--task", default="32px", choices=sorted(TASKS), help="the study's task size")
    parser.add_argument("--batch", type=int, default=16, help="base clips per step")
    parser.add_argument("--per-device", type=int, default=0,
                        help="base clips per batch (0: the whole step; the study's cells take 16 of 128)")
    parser.add_argument("--num-train", type=int, default=256)
    parser.add_argument("--num-val", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=12.0)
    parser.add_argument("--precise-bn-iters", type=int, default=200, help="batches per precise BN pass (the study's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "output", "multigrid_profile"))
    parser.add_argument("--json", default=None, help="write the summaries here")
    parser.add_argument("--dry-run", action="store_true", help="print each run's steps and overrides, train nothing")
    args = parser.parse_args(argv)
    results = {}
    for schedule in args.schedules:
        out = os.path.join(args.output_dir, f"{args.task}_bs{args.batch}x{args.per_device or args.batch}", schedule)
        grid, plan = profile_plan(args.task, schedule, args.batch, args.num_train, args.num_val, args.epochs,
                                  out, args.precise_bn_iters, args.per_device)  # fmt: skip
        print(f"== {schedule}: {plan.cell.name}, {plan.iterations} steps on {args.num_train} videos "
              f"x {args.epochs:g} epochs ({args.task})", flush=True)  # fmt: skip
        if args.dry_run:
            print("  " + " ".join(shlex.quote(o) for o in plan.overrides))
            continue
        process_s = run(grid, plan, out, args.threads)
        summary = read_stage_times(out)[-1]
        results[schedule] = dict(summary, process_s=round(process_s, 1), iterations=plan.iterations)
        print(format_stage_times(summary))
        print(f"(the process: {process_s:.1f} s, start-up and data generation included)\n", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"task": args.task, "batch": args.batch, "num_train": args.num_train,
                       "epochs": args.epochs, "schedules": results}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
