"""Runs the video batch-scaling study: one ``projects/video/train.py`` subprocess per cell,
a CSV row per finished cell; resumable, several processes at once (a lock file per cell).

The command line is ``study/video_batch_study.py``; the grid and the plan
of each cell are in :mod:`video_study.grid`. Claiming, CSV appends, the training
subprocess and its wall clock are the detection study's (:mod:`largedet_study.runner`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import List, Optional

from largedet.launch.run_summary import read_run_summary, training_seconds
from largedet_video.engine.stage_times import read_stage_times
from largedet_study import speed_probe
from largedet_study.runner import CARRY_HELP, _interrupt_on_sigterm, finished_run, read_done, run_todo, train

from .grid import (
    ROOT,
    VIDEO_CSV_FIELDS,
    VIDEO_GRID_NAMES,
    VIDEO_HOLDOUT_CSV_FIELDS,
    VIDEO_STAGE_CSV_FIELDS,
    VideoPlan,
    build_video_grid,
    final_top1,
    plan_video_cell,
)

__all__ = ["main", "run_cell", "stage_seconds", "summarize_video_cell"]

#: how a cell's training process is started
VIDEO_TRAIN_COMMAND = (sys.executable, os.path.join(ROOT, "projects", "video", "train.py"))


def run_cell(plan: VideoPlan, run_dir: str, args, probe=speed_probe.record):
    """Train ``plan``'s cell in ``run_dir`` (resuming it there); (exit status, log, wall s).
    In a grid with stage columns (a timed grid) the machine-speed probe
    (:mod:`largedet_study.speed_probe`) runs just before and just after the training; a cell
    that starts from step 0 forgets an earlier attempt's probes."""
    timed = args.grid_obj.stage_columns
    if timed:
        if not os.path.exists(os.path.join(run_dir, "last_checkpoint")):
            speed_probe.reset(run_dir)
        probe(run_dir, "start", threads=args.threads)
    result = train(plan.overrides, run_dir, args)
    if timed:
        probe(run_dir, "end", threads=args.threads)
    return result


def train_seconds(run_dir: str) -> str:
    """The run's wall clock less its evaluation, summed over its invocations
    (:func:`~largedet.launch.run_summary.training_seconds`), to 0.1 s; "" where the summary has
    no invocation timed."""
    seconds = training_seconds(run_dir)
    return "" if seconds is None else f"{seconds:.1f}"


def stage_seconds(run_dir: str) -> dict:
    """The run's training-step, data and precise-BN seconds summed over its invocations'
    ``stage_times.json`` entries (to 0.1 s); "" each where there is none, or where an
    invocation of its ``run_summary.json`` has none (killed: ``stage_times.json`` is written
    at an invocation's end, and a sum without it would leave its steps out)."""
    invocations = read_stage_times(run_dir)
    summary = (read_run_summary(run_dir) or {}).get("invocations") or []
    if not invocations or len(invocations) < len(summary):
        return {"step_s": "", "data_s": "", "precise_bn_s": ""}
    return {k: f"{sum(i[k] for i in invocations):.1f}" for k in ("step_s", "data_s", "precise_bn_s")}


def summarize_video_cell(plan: VideoPlan, run_dir: str, returncode: int, wall: float, args) -> Optional[dict]:
    """The CSV row of a finished run, or None when it failed for a reason other than
    divergence (the detection study's :func:`largedet_study.runner.finished_run`) or wrote
    no top-1."""
    run = finished_run(run_dir, returncode)
    if run is None:
        return None
    diverged = run.diverged
    top1 = final_top1(run.metrics, args.grid_obj.report_set)
    if not diverged and top1 == "":
        return None
    grid = args.grid_obj
    row = {
        "cell": plan.cell.name,
        "optimizer": plan.cell.optimizer,
        "batch": plan.cell.batch,
        "batch_fraction": f"{plan.cell.batch / grid.num_train:.4f}",
        "ims_per_device": plan.per_device,
        "accumulation": plan.cell.batch // (plan.per_device * args.num_gpus),
        "lr_rule": grid.recipe(plan.cell.optimizer).rule,
        "lr": f"{plan.lr:.6g}",
        "warmup_iters": plan.warmup,
        "iterations": plan.iterations,
        "epochs": f"{grid.epochs * plan.cell.epochs_factor:g}",
        "pmd_period": plan.pmd_period or "",
        "multigrid": "yes" if plan.cell.multigrid else "no",
        "seed": "" if plan.cell.seed is None else plan.cell.seed,
        "top1": "" if diverged else top1,
        "diverged": "yes" if diverged else "no",
        "final_loss": run.final_loss,
        "wall_clock_s": f"{wall:.1f}",
        "clips_per_s": run.speed,
        "device": args.device_label,
        "threads": args.threads,
        "output_dir": os.path.relpath(run_dir, ROOT),
    }
    if grid.holdout_set is not None:
        holdout_top1 = final_top1(run.metrics, grid.holdout_set)
        if not diverged and holdout_top1 == "":
            return None
        row.update(
            # a multigrid cell runs the step schedule whatever its name says
            lr_schedule="step" if plan.cell.multigrid else plan.cell.lr_schedule,
            warmup_epochs=f"{grid.warmup_epochs if plan.cell.warmup_epochs is None else plan.cell.warmup_epochs:g}",
            holdout_top1="" if diverged else holdout_top1,
            val_videos=final_top1(run.metrics, grid.report_set, key="num_videos"),
            holdout_videos=final_top1(run.metrics, grid.holdout_set, key="num_videos"),
            train_s=train_seconds(run_dir),
        )
    if grid.stage_columns:
        row.update(stage_seconds(run_dir))
        row.update(speed_probe.row_columns(run_dir))
    return row


def main(argv: Optional[List[str]] = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="tsm", choices=VIDEO_GRID_NAMES)
    parser.add_argument("--output-dir", default=None, help="default: output/video_batch_study/GRID")
    parser.add_argument("--csv", default=None, help="default: OUTPUT_DIR/study.csv")
    parser.add_argument("--archive", default=None,
                        help="copy each finished cell's config.yaml and metrics.json into ARCHIVE/<cell>/")
    parser.add_argument("--carry", default=None, help=CARRY_HELP)
    parser.add_argument("--only", nargs="*", default=None, help="run only these cells (names from --dry-run)")
    parser.add_argument("--skip", nargs="*", default=(), help="leave out these cells")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--device-label", default="", help="machine name written into the CSV")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    args.num_gpus = 1
    args.grid_obj = grid = build_video_grid(args.grid)
    args.train_command = VIDEO_TRAIN_COMMAND
    args.device_label = args.device_label or f"{os.cpu_count()} CPU cores"
    args.output_dir = args.output_dir or os.path.join(ROOT, "output", "video_batch_study", args.grid)
    os.makedirs(args.output_dir, exist_ok=True)
    csv_path = args.csv or os.path.join(args.output_dir, "study.csv")
    if args.only:
        unknown = set(args.only) - {c.name for c in grid.cells}
        if unknown:
            parser.error(f"--only: unknown cells {sorted(unknown)}; see --dry-run")
    cells = [c for c in grid.cells if (args.only is None or c.name in args.only) and c.name not in args.skip]
    plans = [plan_video_cell(grid, c, os.path.join(args.output_dir, c.name)) for c in cells]
    done = read_done(csv_path)
    print(f"video batch study ({args.grid} grid): {len(plans)} cells, "
          f"{sum(p.cell.name in done for p in plans)} done; CSV {csv_path}")  # fmt: skip
    if args.dry_run:
        print(f"  N = {grid.num_train} training clips, {grid.epochs:g} epochs for every cell")
        for p in plans:
            mark = "done" if p.cell.name in done else "todo"
            print(f"  [{mark}] {p.cell.name:24s} batch/N {100 * p.cell.batch / grid.num_train:5.2f}% "
                  f"lr {p.lr:<8.4g} iterations {p.iterations:5d} warmup {p.warmup:4d} "
                  f"T {p.pmd_period or '-'}{' steps ' + str(p.steps) if p.steps else ''}")  # fmt: skip
        return 0
    return run_todo(
        plans, csv_path, args,
        run=lambda plan, run_dir, args: run_cell(plan, run_dir, args),
        summarize=summarize_video_cell,
        describe=lambda row: "diverged" if row["diverged"] == "yes" else f"top-1 {row['top1']}%",
        fields=(VIDEO_STAGE_CSV_FIELDS if grid.stage_columns
                else VIDEO_CSV_FIELDS if grid.holdout_set is None else VIDEO_HOLDOUT_CSV_FIELDS),
    )  # fmt: skip
