"""Runs the batch-scaling study: one training subprocess (``python -m
largedet.engine.train_net``, i.e. ``tools/train_net.py``) per cell, a CSV row
per finished cell; resumable, several processes at once (a lock file per cell).

``study/batch_scaling_study.py`` is its command line; the grids and the per-cell
plan are in :mod:`largedet_study.grid`.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from largedet.launch.run_summary import read_run_summary
from . import carry as carry_mod
from .grid import CSV_FIELDS, GRID_NAMES, HOLDOUT_SET, Plan, build_grid, cell_config, final_ap, plan_cell
from .reevaluate import read_csv_rows, reevaluate_cells, todo_cells

# the checkout this package lives in: relative output paths and the grid's configs
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: how a cell's training (or evaluation) process is started: tools/train_net.py as a module
TRAIN_COMMAND = (sys.executable, "-m", "largedet.engine.train_net")


def read_done(csv_path: str) -> Dict[str, dict]:
    if not os.path.exists(csv_path):
        return {}
    with open(csv_path, newline="") as f:
        return {row["cell"]: row for row in csv.DictReader(f)}


def append_row(csv_path: str, row: dict, fields: Sequence[str] = CSV_FIELDS) -> None:
    """Append under an exclusive lock (several study processes may share the file)."""
    with open(csv_path, "a", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        writer = csv.DictWriter(f, fieldnames=list(fields))
        if f.tell() == 0:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def read_metrics(path: str) -> List[dict]:
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut short by a crash
    return rows


@dataclass(frozen=True)
class FinishedRun:
    """What a cell's row reads from its run directory."""

    metrics: List[dict]
    diverged: bool
    #: the last record's ``total_loss`` ("" when none was written)
    final_loss: str
    #: the last invocation's images (clips) per second, as Detectron2's "Overall training
    #: speed" reports it ("" when unknown)
    speed: str


def finished_run(run_dir: str, returncode: int) -> Optional[FinishedRun]:
    """The metrics and ending of a run, or None when it failed for a reason other than
    divergence. How the run ended and its speed come from its ``run_summary.json``: the
    divergence guard (largedet.engine.DivergenceGuard) and Detectron2's own non-finite
    checks (loss; RPN proposals) raise FloatingPointError, status "diverged"."""
    metrics = read_metrics(os.path.join(run_dir, "metrics.json"))
    summary = read_run_summary(run_dir) or {}
    diverged = returncode != 0 and summary.get("status") == "diverged"
    if returncode != 0 and not diverged:
        return None
    losses = [m["total_loss"] for m in metrics if "total_loss" in m]
    speed = ((summary.get("invocations") or [{}])[-1]).get("images_per_s") or ""
    return FinishedRun(
        metrics=metrics,
        diverged=diverged,
        final_loss=f"{losses[-1]:.4f}" if losses else "",
        speed=f"{speed:.2f}" if speed != "" else "",
    )


def summarize(plan: Plan, run_dir: str, returncode: int, wall: float, args) -> Optional[dict]:
    """The CSV row of a finished run, or None when it failed for a reason other than
    divergence (:func:`finished_run`) or wrote no AP."""
    run = finished_run(run_dir, returncode)
    if run is None:
        return None
    metrics, diverged = run.metrics, run.diverged
    ap = final_ap(metrics, args.grid_obj.report_set)
    holdout = final_ap(metrics, HOLDOUT_SET, only_named=True)
    if not diverged and ap["AP"] == "":
        return None
    per_device = int(plan.overrides[plan.overrides.index("SOLVER.IMS_PER_DEVICE") + 1])
    return {
        "cell": plan.cell.name,
        "optimizer": plan.cell.optimizer,
        "batch": plan.cell.batch,
        "ims_per_device": per_device,
        "accumulation": plan.cell.batch // (per_device * args.num_gpus),
        "lr_rule": args.grid_obj.recipe(plan.cell.optimizer).rule,
        "lr": f"{plan.lr:.6g}",
        "warmup_iters": plan.warmup,
        "iterations": plan.optimizer_steps or plan.iterations,
        "epochs": f"{args.grid_obj.epochs * plan.cell.epochs_factor:g}",
        "pmd_period": plan.pmd_period or "",
        "pmd_decay": plan.cell.pmd_decay if plan.pmd_period else "",
        "agvm": "yes" if plan.cell.agvm else "no",
        "wall_clock_s": f"{wall:.1f}",
        "images_per_s": run.speed,
        "box_ap": "" if diverged else ap["AP"],
        "ap50": "" if diverged else ap["AP50"],
        "ap75": "" if diverged else ap["AP75"],
        "diverged": "yes" if diverged else "no",
        "final_loss": run.final_loss,
        "device": args.device_label,
        "threads": args.threads,
        "output_dir": os.path.relpath(run_dir, ROOT),
        "seed": "" if plan.cell.seed is None else plan.cell.seed,
        "warmup_epochs": f"{plan.warmup * plan.cell.batch / args.grid_obj.num_train:g}",
        "lr_factor": f"{plan.cell.lr_factor:g}",
        "holdout_ap": "" if diverged else holdout["AP"],
        "holdout_ap50": "" if diverged else holdout["AP50"],
    }


def claim(lock_path: str) -> bool:
    """Create ``lock_path`` exclusively; a lock left by a dead process is taken over."""
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            pid = int(open(lock_path).read().strip() or 0)
            os.kill(pid, 0)
            return False  # another live study process runs this cell
        except (ValueError, ProcessLookupError):
            os.remove(lock_path)
            return claim(lock_path)
        except PermissionError:
            return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


WALL_CLOCK_FILE = "study_wall_clock_s"


def _read_wall_clock(run_dir: str) -> float:
    try:
        with open(os.path.join(run_dir, WALL_CLOCK_FILE)) as f:
            return float(f.read().strip() or 0.0)
    except (OSError, ValueError):
        return 0.0


def _write_wall_clock(run_dir: str, seconds: float) -> None:
    path = os.path.join(run_dir, WALL_CLOCK_FILE)
    with open(path + ".tmp", "w") as f:
        f.write(f"{seconds:.1f}\n")
    os.replace(path + ".tmp", path)


def train(overrides: Sequence[str], run_dir: str, args) -> Tuple[int, str, float]:
    """Run :data:`TRAIN_COMMAND` (or ``args.train_command``, e.g. the video trainer) on the grid's config with ``overrides`` (resuming from
    ``run_dir``'s last checkpoint if there is one); its output goes to run_dir/study_log.txt.
    Returns the exit status, the log text and the wall-clock seconds of the whole run:
    those of earlier, interrupted invocations too (kept in ``run_dir/study_wall_clock_s``,
    updated every 30 s, so a killed invocation loses at most that)."""
    os.makedirs(run_dir, exist_ok=True)
    command = getattr(args, "train_command", None) or TRAIN_COMMAND
    cmd = [*command, "--config", os.path.join(ROOT, args.grid_obj.config)]
    if args.num_gpus > 1:
        cmd += ["--num-gpus", str(args.num_gpus)]
    resuming = os.path.exists(os.path.join(run_dir, "last_checkpoint"))
    if resuming:
        cmd.append("--resume")
    else:
        # a cell stopped before its first checkpoint starts again from step 0: the records of
        # that attempt go (the trainer refuses a fresh run on a folder that holds results)
        for stale in ["metrics.json", *(n for n in os.listdir(run_dir) if n.startswith("model_") and n.endswith(".pth"))]:
            if os.path.isfile(os.path.join(run_dir, stale)):
                os.remove(os.path.join(run_dir, stale))
    cmd += list(overrides)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    log_path = os.path.join(run_dir, "study_log.txt")
    before = _read_wall_clock(run_dir) if resuming else 0.0
    start = time.perf_counter()
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    proc.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    _write_wall_clock(run_dir, before + time.perf_counter() - start)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM from `timeout`): stop the run too
            _stop(proc)
            _write_wall_clock(run_dir, before + time.perf_counter() - start)
            raise
    wall = before + time.perf_counter() - start
    _write_wall_clock(run_dir, wall)
    with open(log_path) as f:
        text = f.read()
    return proc.returncode, text, wall


def _stop(proc: subprocess.Popen) -> None:
    """Terminate a training subprocess (SIGTERM, then SIGKILL after 30 s), so that no run
    outlives its study process: the next one resumes the cell from its last checkpoint."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_cell(plan: Plan, run_dir: str, args) -> Tuple[int, str, float]:
    return train(plan.overrides, run_dir, args)


BACKBONE_PREFIX = "backbone.bottom_up."


def pretrained_path(args) -> Optional[str]:
    """Where :func:`ensure_pretrained` keeps the grid's backbone (None: no pre-training)."""
    if args.grid_obj.pretrain is None:
        return None
    return os.path.join(args.output_dir, "pretrain", "backbone.pth")


def ensure_pretrained(args) -> Optional[str]:
    """The grid's pretrained backbone file (trained once, shared by every cell and every
    study process), or None when the grid trains from scratch."""
    grid = args.grid_obj
    if grid.pretrain is None:
        return None
    path = pretrained_path(args)
    run_dir = os.path.dirname(path)
    os.makedirs(run_dir, exist_ok=True)
    lock = os.path.join(run_dir, "study.lock")
    while not os.path.exists(path):
        if not claim(lock):
            time.sleep(10)  # another study process is training it
            continue
        try:
            print(f"pre-training the backbone ({' '.join(grid.pretrain)}) ...", flush=True)
            overrides = list(grid.extra_overrides) + list(grid.pretrain) + ["OUTPUT_DIR", run_dir]
            returncode, text, wall = train(overrides, run_dir, args)
            if returncode != 0:
                tail = "\n".join(text.strip().splitlines()[-5:])
                raise RuntimeError(
                    f"pre-training failed (exit {returncode}); see {run_dir}/study_log.txt:\n{tail}"
                )
            import torch

            model = torch.load(os.path.join(run_dir, "model_final.pth"), map_location="cpu", weights_only=True)[
                "model"
            ]
            backbone = {k: v for k, v in model.items() if k.startswith(BACKBONE_PREFIX)}
            torch.save({"model": backbone, "matching_heuristics": False}, path + ".tmp")
            os.replace(path + ".tmp", path)
            print(
                f"    {len(backbone)} backbone tensors in {path} ({wall / 60:.1f} min)", flush=True
            )
        finally:
            os.remove(lock)
    return path


def archive_cell(run_dir: str, dest: str) -> None:
    """Copy what the README's table and figures need of a finished cell (its config,
    metrics.json and, in a timed grid, speed_probe.json and stage_times.json) to ``dest``, where it is committed."""
    os.makedirs(dest, exist_ok=True)
    for name in ("config.yaml", "metrics.json", "speed_probe.json", "stage_times.json"):
        src = os.path.join(run_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))


#: ``--carry``'s help, shared by the detection and the video study's command lines
CARRY_HELP = (
    "keep an interrupted cell's last checkpoint and records in CARRY/<cell>/ (on a shared disk: "
    "another machine resumes the cell from there); removed when the cell finishes"
)


def run_todo(plans: Sequence, csv_path: str, args, run: Callable, summarize: Callable,
             describe: Callable[[dict], str], fields: Sequence[str] = CSV_FIELDS) -> int:
    """Train every plan whose cell is not in ``csv_path`` yet, in order: claim the cell (a lock
    file in its run folder, so several study processes share the work), ``run(plan, run_dir,
    args)`` -> (exit status, log, wall s), ``summarize(plan, run_dir, status, wall, args)`` ->
    its CSV row (None: a failure, retried the next time), append it, archive the run
    (``args.archive``) and print ``describe(row)`` with the time and the ETA of the rest.
    Returns 1 when a cell failed, else 0. The detection and the video study run through it."""
    failures, finished, started = [], 0, time.time()
    done = read_done(csv_path)
    todo = [p for p in plans if p.cell.name not in done]
    for index, plan in enumerate(todo):
        name = plan.cell.name
        if name in read_done(csv_path):
            continue
        run_dir = os.path.join(args.output_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        lock = os.path.join(run_dir, "study.lock")
        if not claim(lock):
            print(f"[{index + 1}/{len(todo)}] {name}: running in another study process, skipped")
            continue
        carried = os.path.join(args.carry, name) if getattr(args, "carry", None) else None
        try:
            print(f"[{index + 1}/{len(todo)}] {name}: {plan.iterations} iterations at LR {plan.lr:.4g} ...", flush=True)
            if carried and carry_mod.restore(carried, run_dir):
                print(f"    resuming from the carried checkpoint in {carried}", flush=True)
            try:
                returncode, text, wall = run(plan, run_dir, args)
            except BaseException:
                if carried and carry_mod.save(run_dir, carried):
                    print(f"    interrupted: last checkpoint carried to {carried}", flush=True)
                raise
            row = summarize(plan, run_dir, returncode, wall, args)
            if row is None:
                failures.append(name)
                tail = "\n".join(text.strip().splitlines()[-5:])
                print(f"    FAILED (exit {returncode}); see {run_dir}/study_log.txt:\n{tail}", flush=True)
                continue
            append_row(csv_path, row, fields)
            if args.archive:
                archive_cell(run_dir, os.path.join(args.archive, name))
            if carried:
                carry_mod.discard(carried)
            finished += 1
            eta = (time.time() - started) / finished * (len(todo) - index - 1)
            print(f"    {describe(row)}, {wall / 60:.1f} min; ETA of the rest {eta / 60:.0f} min", flush=True)
        finally:
            os.remove(lock)
    if failures:
        print(f"{len(failures)} cell(s) failed and will be retried on the next run: {', '.join(failures)}")
        return 1
    return 0


def main(argv=None) -> int:
    # SIGTERM (``timeout``, a scheduler) unwinds like Ctrl-C: the running cell's training
    # process is stopped and its lock released
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="steps", choices=GRID_NAMES)
    parser.add_argument(
        "--output-dir", default=None, help="default: output/batch_scaling_study/GRID"
    )
    parser.add_argument("--csv", default=None, help="default: OUTPUT_DIR/study.csv")
    parser.add_argument(
        "--archive",
        default=None,
        help="copy each finished cell's config.yaml and metrics.json into ARCHIVE/<cell>/",
    )
    parser.add_argument("--carry", default=None, help=CARRY_HELP)
    parser.add_argument(
        "--only", nargs="*", default=None, help="run only these cells (names from --dry-run)"
    )
    parser.add_argument("--skip", nargs="*", default=(), help="leave out these cells")
    parser.add_argument(
        "--warmup-epochs", type=float, default=None, help="default: the grid's (steps 40, short 2)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (CPU)")
    parser.add_argument(
        "--num-gpus", type=int, default=1, help="processes per run (GPUs, or gloo CPU processes)"
    )
    parser.add_argument("--device-label", default="", help="machine name written into the CSV")
    parser.add_argument(
        "--set",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="a config override added to every cell's run, e.g. DATALOADER.NUM_WORKERS 2 on a "
        "GPU machine (repeatable; name it in --device-label: the CSV does not record it)",
    )
    parser.add_argument(
        "--pretrain-only",
        action="store_true",
        help="make the grid's pre-trained backbone (OUTPUT_DIR/pretrain/backbone.pth) and stop",
    )
    parser.add_argument(
        "--eval-images",
        type=int,
        default=None,
        metavar="N",
        help="train nothing: evaluate every finished cell's final model again on the held-out "
        "and the reported split with N images each (the first 150 the usual ones) into --eval-csv",
    )
    parser.add_argument("--eval-csv", default=None, help="default: OUTPUT_DIR/eval_<N>.csv")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    if args.eval_images is not None and args.eval_images < 1:
        parser.error(f"--eval-images must be at least 1, got {args.eval_images}")
    args.grid_obj = build_grid(args.grid)
    if args.output_dir is None:
        args.output_dir = os.path.join(ROOT, "output", "batch_scaling_study", args.grid)
    if not args.device_label:
        args.device_label = f"{os.cpu_count()} CPU cores" if args.grid != "gpu" else "gpu"
    os.makedirs(args.output_dir, exist_ok=True)
    csv_path = args.csv or os.path.join(args.output_dir, "study.csv")
    cells = [
        c
        for c in args.grid_obj.cells
        if (args.only is None or c.name in args.only) and c.name not in args.skip
    ]
    if args.only:
        unknown = set(args.only) - {c.name for c in args.grid_obj.cells}
        if unknown:
            parser.error(f"--only: unknown cells {sorted(unknown)}; see --dry-run")
    plans = [
        plan_cell(
            args.grid_obj,
            c,
            args.warmup_epochs,
            os.path.join(args.output_dir, c.name),
            args.num_gpus,
        )
        for c in cells
    ]
    if args.set:
        try:  # a misspelt key fails here, not in every cell's training process
            cell_config(args.grid_obj.config, [x for kv in args.set for x in kv])
        except Exception as e:  # yacs raises KeyError, ValueError or AssertionError
            parser.error(f"--set: {e}")
    for key, value in args.set:
        for p in plans:
            p.overrides += [key, value]
    if args.eval_images is not None:
        eval_csv = args.eval_csv or os.path.join(args.output_dir, f"eval_{args.eval_images}.csv")
        if args.dry_run:
            todo = todo_cells([p.cell.name for p in plans], read_done(csv_path), args.output_dir,
                              read_csv_rows(eval_csv))  # fmt: skip
            print(f"would evaluate on {args.eval_images} images: {' '.join(todo) or 'nothing'}")
            return 0
        try:
            reevaluate_cells([p.cell.name for p in plans], read_done(csv_path), args.output_dir,
                             args.eval_images, eval_csv, TRAIN_COMMAND, args.threads,
                             args.device_label)  # fmt: skip
        except ValueError as e:
            parser.error(str(e))
        print(f"evaluations on {args.eval_images} images: {eval_csv}")
        return 0
    if args.pretrain_only:
        weights = ensure_pretrained(args)
        print(f"pre-trained backbone: {weights}" if weights else f"{args.grid}: no pre-training")
        return 0
    done = read_done(csv_path)
    todo = [p.cell.name for p in plans if p.cell.name not in done]
    if not args.dry_run and todo:
        # cells that all resume from a checkpoint (their own or a carried one) load their
        # whole model from it: the backbone is not pre-trained again for them
        resuming = all(carry_mod.resumes(os.path.join(args.output_dir, name),
                                         os.path.join(args.carry, name) if args.carry else None)
                       for name in todo)  # fmt: skip
        weights = pretrained_path(args) if resuming else ensure_pretrained(args)
        if weights:
            for p in plans:
                p.overrides += ["MODEL.WEIGHTS", weights]
    print(
        f"batch-scaling study ({args.grid} grid): {len(plans)} cells, {sum(p.cell.name in done for p in plans)} done; CSV {csv_path}"
    )
    if args.dry_run:
        n = args.grid_obj.num_train
        print(f"  N = {n} training images; batch/N and epochs per cell")
        for p in plans:
            mark = "done" if p.cell.name in done else "todo"
            epochs = p.iterations * p.cell.batch / n
            print(
                f"  [{mark}] {p.cell.name:40s} batch/N {100 * p.cell.batch / n:5.2f}% epochs {epochs:6.4g} "
                f"lr {p.lr:<8.4g} iterations {p.iterations:5d} warmup {p.warmup:4d} steps {p.steps or p.cell.lr_schedule} T {p.pmd_period or '-'}"
            )
        return 0
    return run_todo(
        plans, csv_path, args,
        run=lambda plan, run_dir, args: run_cell(plan, run_dir, args),
        summarize=lambda *a: summarize(*a),
        describe=lambda row: ("diverged" if row["diverged"] == "yes" else f"box AP {row['box_ap']}")
        + f", {row['images_per_s']} images/s",
    )  # fmt: skip

