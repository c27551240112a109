#!/usr/bin/env python3
"""The large-batch study: box AP against global batch for each optimizer, same epochs.

For each optimizer (SGD with the linear scaling rule, LAMB, PMD-LAMB, LARS, AdamW) and
global batch, trains the same detector on the same data for the same number of epochs
through ``tools/train_net.py`` (one subprocess per run, gradient accumulation where the
batch exceeds one pass), evaluates box AP and appends one CSV row per run. Extra cells:
PMD-LAMB's period T and decay shape at the largest batch, and AGVM on/off at the two
largest batches.

    python benchmarks/batch_scaling_study.py                 # the CPU grid, 2-3 hours on 2 cores
    python benchmarks/batch_scaling_study.py --dry-run       # the plan: cells, LR, iterations
    python benchmarks/batch_scaling_study.py --grid gpu --num-gpus 8
    python tools/plot_metrics.py --study output/batch_scaling_study/study.csv

Resumable: cells already in the CSV are skipped, and an interrupted cell resumes from
its last checkpoint (``--resume``). Several copies of this script may run at once on the
same output directory (each cell is claimed with a lock file), for example one per core.
A run that the divergence guard stops (non-finite or exploding loss) is a result:
``diverged`` is ``yes`` and AP is empty. Any other failure is reported and retried the
next time the script runs.

How each cell is set (the same for every optimizer; see ``GRIDS`` and ``OPTIMIZERS``):
  * iterations = epochs x training images / batch; warm-up = ``--warmup-epochs`` of
    images (at least 3 steps); LR x0.1 at 3/4 and 11/12 of the run;
  * peak LR = the optimizer's reference LR at batch 16 scaled by its rule: linear for
    SGD (the linear scaling rule), square root for the adaptive and layer-wise ones;
  * PMD-LAMB's period T = a quarter of the run's iterations (four periods), cosine decay.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


@dataclass(frozen=True)
class OptimizerRecipe:
    """How one optimizer is run in the study: its name in ``SOLVER.OPTIMIZER``, peak LR at
    the reference batch 16, the LR scaling rule and any extra config overrides."""

    name: str
    reference_lr: float
    rule: str
    weight_decay: float = 1e-4
    overrides: Tuple[str, ...] = ()


# Reference LRs at batch 16. SGD: Detectron2's 0.02. LAMB and PMD-LAMB: a relative step
# of 1% per iteration (0.02 at batch 64 was the best of 0.01/0.02/0.04 on the shapes
# demo). LARS: eta = 0.001 with momentum 0.9 gives the same 1% relative step at LR 1;
# all its layers are adapted (a plain SGD step at LARS's LR would blow up the norm
# layers). AdamW: 1e-3, the usual from-scratch value, with decoupled weight decay 0.05.
OPTIMIZERS: Dict[str, OptimizerRecipe] = {
    "sgd": OptimizerRecipe("SGD", 0.02, "linear"),
    "lamb": OptimizerRecipe("LAMB", 0.01, "sqrt"),
    "pmd_lamb": OptimizerRecipe("PMD_LAMB", 0.01, "sqrt"),
    "lars": OptimizerRecipe(
        "LARS", 1.0, "sqrt", overrides=("SOLVER.ADAPT_NORM", "True", "SOLVER.ADAPT_BIAS", "True")
    ),
    "adamw": OptimizerRecipe("AdamW", 1e-3, "sqrt", weight_decay=0.05),
}
REFERENCE_BATCH = 16


@dataclass(frozen=True)
class Cell:
    """One training run of the study."""

    optimizer: str
    batch: int
    pmd_period: Optional[int] = None  # PMD-LAMB only; None: a quarter of the run
    pmd_decay: str = "cosine"
    agvm: bool = False
    # AGVM's estimate period and moving-average momentum; None: the config's (10, 0.97)
    agvm_period: Optional[int] = None
    agvm_momentum: Optional[float] = None
    seed: Optional[int] = None  # SEED of the run (initialisation, data order); None: the config's
    lr_factor: float = 1.0  # multiplies the scaled LR (LR sweeps)
    epochs_factor: float = 1.0  # multiplies the grid's epochs (longer schedules)
    warmup_epochs: Optional[float] = None  # None: the grid's (or --warmup-epochs)

    @property
    def name(self) -> str:
        parts = [self.optimizer, f"bs{self.batch}"]
        if self.epochs_factor != 1.0:
            parts.append(f"ep{self.epochs_factor:g}x")
        if self.warmup_epochs is not None:
            parts.append(f"wu{self.warmup_epochs:g}")
        if self.pmd_period is not None or self.pmd_decay != "cosine":
            parts.append(f"T{self.pmd_period or 'auto'}-{self.pmd_decay}")
        if self.lr_factor != 1.0:
            parts.append(f"lrx{self.lr_factor:g}")
        if self.agvm:
            parts.append("agvm")
            if self.agvm_period is not None:
                parts.append(f"p{self.agvm_period}m{self.agvm_momentum:g}")
        if self.seed is not None:
            parts.append(f"s{self.seed}")
        return "-".join(parts)


@dataclass(frozen=True)
class Grid:
    """A study: the base config, the data size, the epochs and the cells."""

    config: str
    num_train: int
    epochs: int
    ims_per_device: int
    cells: Tuple[Cell, ...]
    extra_overrides: Tuple[str, ...] = ()
    # Overrides of a batch-16 SGD run on a *different* split of the data whose trained
    # ResNet (``backbone.bottom_up``) initialises every cell, as ImageNet weights do on
    # COCO; None: every cell trains from scratch (or from extra_overrides' MODEL.WEIGHTS).
    pretrain: Optional[Tuple[str, ...]] = None
    # warm-up in epochs of the grid's training set (at least 3 steps, at most half the run)
    warmup_epochs: float = 2.0
    # the optimizers' reference LRs and rules; None: OPTIMIZERS
    optimizers: Optional[Dict[str, OptimizerRecipe]] = None
    # the test set the README reports; the others (a held-out split) choose the recipe
    report_set: str = "shapes_val"

    def recipe(self, optimizer: str) -> OptimizerRecipe:
        table = self.optimizers or OPTIMIZERS
        if optimizer not in table:
            raise ValueError(f"unknown optimizer {optimizer!r}; one of {sorted(table)}")
        return table[optimizer]


def _main_grid(batches: Sequence[int]) -> List[Cell]:
    # largest batch first within each optimizer round, so a partial study already
    # shows the interesting end of every curve
    return [Cell(opt, b) for b in sorted(batches, reverse=True) for opt in OPTIMIZERS]


def _extra_cells(batches: Sequence[int], iterations_at_largest: int) -> List[Cell]:
    largest, second = sorted(batches)[-1], sorted(batches)[-2]
    quarter = max(1, iterations_at_largest // 4)
    sweep = [
        Cell("pmd_lamb", largest, pmd_period=max(1, quarter // 2)),
        Cell("pmd_lamb", largest, pmd_period=quarter * 2),
        Cell("pmd_lamb", largest, pmd_period=quarter, pmd_decay="linear"),
    ]
    # the same sweep at the second-largest batch, where every adaptive optimizer trains
    quarter2 = quarter * (largest // second)
    sweep += [
        Cell("pmd_lamb", second, pmd_period=max(1, quarter2 // 2)),
        Cell("pmd_lamb", second, pmd_period=quarter2 * 2),
        Cell("pmd_lamb", second, pmd_period=quarter2, pmd_decay="linear"),
    ]
    agvm = [
        Cell(opt, b, agvm=True) for b in (largest, second) for opt in ("sgd", "pmd_lamb", "adamw")
    ]
    # LR around each rule's value at the second-largest batch, where the defaults are chosen
    factors = {"sgd": (0.25, 0.5), "lamb": (0.5, 2.0), "pmd_lamb": (0.5, 2.0), "lars": (0.5, 2.0),
               "adamw": (0.5, 2.0)}  # fmt: skip
    lr_sweep = [Cell(opt, second, lr_factor=f) for opt, fs in factors.items() for f in fs]
    # AGVM at the paper's period 10 and momentum 0.97 barely moves mu in a run of a few
    # dozen steps; these estimate every step with momentum 0.8 (a ~5-step average)
    agvm_short = [
        Cell(opt, second, agvm=True, agvm_period=1, agvm_momentum=0.8)
        for opt in ("lamb", "pmd_lamb", "adamw")
    ]
    # a second seed of the cells whose differences the README reads, for the noise
    repeats = [
        Cell("lamb", second, seed=1),
        Cell("pmd_lamb", second, seed=1),
        Cell("pmd_lamb", second, agvm=True, seed=1),
    ]
    return sweep + agvm + lr_sweep + agvm_short + repeats


# The steps-matched grid's optimizers. SGD keeps Detectron2's 0.02 at batch 16 and the
# linear rule. The adaptive ones keep the square-root rule from half the short-budget
# grid's reference: PMD-LAMB at 0.08 (0.01 x sqrt(1024/16)) diverged at step 118 of 300
# at batch 1024 in the calibration runs (DESIGN.md), 0.04 trained.
STEPS_OPTIMIZERS: Dict[str, OptimizerRecipe] = {
    "sgd": OPTIMIZERS["sgd"],
    "lamb": OptimizerRecipe("LAMB", 0.005, "sqrt"),
    "pmd_lamb": OptimizerRecipe("PMD_LAMB", 0.005, "sqrt"),
    "adamw": OptimizerRecipe("AdamW", 5e-4, "sqrt", weight_decay=0.05),
}

# what every grid on the shapes data at 64 px evaluates: the held-out split (the val
# split of the seed-1000 data, never trained on) chooses the recipe, shapes_val reports it
_TEST_SETS = ("DATASETS.TEST", "('shapes_holdout_val', 'shapes_val')")


def _steps_cells() -> List[Cell]:
    """The steps-matched grid, in the order two study processes take them: the baseline
    and the batch-1024 cells first, then batch 256, the sweeps around the best batch-1024
    optimizer, and the second seeds."""
    main = [
        # the baseline: Detectron2's SGD at batch 16 with its short warm-up (2 epochs)
        Cell("sgd", 16, warmup_epochs=2),
        Cell("pmd_lamb", 1024),
        Cell("sgd", 1024),
        Cell("pmd_lamb", 1024, epochs_factor=1.4),  # LargeDet's longer schedule
        Cell("lamb", 1024),
        Cell("adamw", 1024),
        Cell("pmd_lamb", 1024, agvm=True),
        Cell("pmd_lamb", 256),
        Cell("sgd", 256),
    ]
    sweeps = [
        Cell("pmd_lamb", 1024, lr_factor=0.5),
        Cell("pmd_lamb", 1024, lr_factor=2.0),
        Cell("pmd_lamb", 1024, warmup_epochs=20),
        Cell("pmd_lamb", 1024, warmup_epochs=80),
        Cell("pmd_lamb", 1024, pmd_period=38),  # T = 1/8 of the run (default 1/4: 75)
        Cell("pmd_lamb", 1024, pmd_period=150),  # T = 1/2 of the run
    ]
    seeds = [
        Cell("sgd", 16, warmup_epochs=2, seed=1),
        Cell("pmd_lamb", 1024, seed=1),
        Cell("sgd", 1024, seed=1),
    ]
    return main + sweeps + seeds


GRID_NAMES = ("steps", "short", "gpu")


def build_grid(name: str) -> Grid:
    batches = (16, 64, 256, 1024)
    pretrain_1536 = (
        "DATASETS.SHAPES.SEED", "1000", "DATASETS.SHAPES.NUM_TRAIN", "1536",
        "DATASETS.TEST", "()",
    )  # fmt: skip
    if name == "steps":
        # Steps-matched: 200 epochs of 1536 images for every batch (307,200 images), so
        # batch 1024 takes 300 optimizer steps, batch 256 1200 and batch 16 19,200; about
        # 45 minutes per cell on one core. Warm-up 40 epochs (20% of the run: 60 steps at
        # batch 1024), LR x0.1 at 3/4 and 11/12, PMD-LAMB's T a quarter of the run.
        return Grid(
            config="configs/shapes/study/Base-Study-R10w16-FPN-64px.yaml",
            num_train=1536,
            epochs=200,
            ims_per_device=16,
            cells=tuple(_steps_cells()),
            extra_overrides=_TEST_SETS,
            # 16 epochs of another 1536 images (seed 1000) at batch 16 with SGD; its FPN
            # and heads are dropped
            pretrain=pretrain_1536,
            warmup_epochs=40.0,
            optimizers=STEPS_OPTIMIZERS,
        )
    if name == "short":
        # The short-budget regime: 16 epochs for every batch, so batch 1024 gets only 24
        # optimizer steps (3 of warm-up). It shows what a fixed, small epoch budget does
        # to each optimizer as the batch grows; it says nothing about batch 1024 given
        # the steps a real schedule has (see "steps").
        num_train, epochs = 1536, 16
        return Grid(
            config="configs/shapes/study/Base-Study-R10w16-FPN-64px.yaml",
            num_train=num_train,
            epochs=epochs,
            ims_per_device=16,
            cells=tuple(_main_grid(batches) + _extra_cells(batches, epochs * num_train // 1024)),
            pretrain=pretrain_1536,
        )
    if name == "gpu":
        # R50-FPN (ImageNet-initialised) on the shapes dataset at 256 px: 12 epochs of
        # 16,384 images, batch 16..1024 (1024: 192 iterations).
        num_train, epochs = 16384, 12
        return Grid(
            config="configs/shapes/Base-Shapes-R18-FPN.yaml",
            num_train=num_train,
            epochs=epochs,
            ims_per_device=16,
            cells=tuple(_main_grid(batches) + _extra_cells(batches, epochs * num_train // 1024)),
            extra_overrides=(
                "MODEL.WEIGHTS", "detectron2://ImageNetPretrained/MSRA/R-50.pkl",
                "MODEL.RESNETS.DEPTH", "50", "MODEL.RESNETS.RES2_OUT_CHANNELS", "256",
                "MODEL.FPN.OUT_CHANNELS", "256", "MODEL.ROI_BOX_HEAD.FC_DIM", "1024",
                "MODEL.BACKBONE.FREEZE_AT", "2", "MODEL.RESNETS.NORM", "SyncBN",
                "DATASETS.SHAPES.IMAGE_SIZE", "256",
                "INPUT.MIN_SIZE_TRAIN", "(256,)", "INPUT.MAX_SIZE_TRAIN", "256",
                "INPUT.MIN_SIZE_TEST", "256", "INPUT.MAX_SIZE_TEST", "256",
                "MODEL.ANCHOR_GENERATOR.SIZES", "[[16],[32],[64],[128],[256]]",
                "DATALOADER.NUM_WORKERS", "4", "SOLVER.AMP.ENABLED", "True",
            ),
        )  # fmt: skip
    raise ValueError(f"--grid must be one of {GRID_NAMES}, got {name!r}")


@dataclass
class Plan:
    """Everything derived for one cell: what the run does and the overrides that say so."""

    cell: Cell
    iterations: int
    warmup: int
    steps: Tuple[int, int]
    lr: float
    pmd_period: Optional[int]
    overrides: List[str] = field(default_factory=list)


def scaled_lr(recipe: OptimizerRecipe, batch: int) -> float:
    ratio = batch / REFERENCE_BATCH
    return recipe.reference_lr * (ratio if recipe.rule == "linear" else math.sqrt(ratio))


def plan_cell(
    grid: Grid, cell: Cell, warmup_epochs: Optional[float], output_dir: str, world: int
) -> Plan:
    """What ``cell`` runs. ``warmup_epochs`` replaces the grid's warm-up for the cells that
    do not set their own (None: the grid's)."""
    recipe = grid.recipe(cell.optimizer)
    epochs = grid.epochs * cell.epochs_factor
    images = epochs * grid.num_train
    if abs(images - round(images)) > 1e-6 or round(images) % cell.batch:
        raise ValueError(
            f"{cell.name}: {epochs:g} epochs x {grid.num_train} images is not a whole number of batches of {cell.batch}"
        )
    iterations = round(images) // cell.batch
    if cell.warmup_epochs is not None:
        warmup_epochs = cell.warmup_epochs
    elif warmup_epochs is None:
        warmup_epochs = grid.warmup_epochs
    warmup = min(iterations // 2, max(3, round(warmup_epochs * grid.num_train / cell.batch)))
    steps = (round(iterations * 3 / 4), round(iterations * 11 / 12))
    lr = scaled_lr(recipe, cell.batch) * cell.lr_factor
    per_device = min(grid.ims_per_device, cell.batch // world)
    period = None
    if recipe.name == "PMD_LAMB":
        period = cell.pmd_period or max(1, iterations // 4)
    overrides = list(grid.extra_overrides) + [
        "DATASETS.SHAPES.NUM_TRAIN", str(grid.num_train),
        "SOLVER.OPTIMIZER", recipe.name,
        "SOLVER.IMS_PER_BATCH", str(cell.batch),
        "SOLVER.IMS_PER_DEVICE", str(per_device),
        "SOLVER.LSR.ENABLED", "True",
        "SOLVER.LSR.RULE", recipe.rule,
        "SOLVER.LSR.REFERENCE_BATCH", str(REFERENCE_BATCH),
        "SOLVER.LSR.REFERENCE_LR", repr(recipe.reference_lr * cell.lr_factor),
        "SOLVER.WEIGHT_DECAY", repr(recipe.weight_decay),
        "SOLVER.MAX_ITER", str(iterations),
        "SOLVER.WARMUP_ITERS", str(warmup),
        "SOLVER.STEPS", f"({steps[0]}, {steps[1]})",
        # about ten checkpoints a run: an interrupted cell loses at most a tenth of it
        "SOLVER.CHECKPOINT_PERIOD", str(max(1, iterations // 10)),
        "SOLVER.DIVERGENCE.WINDOW", "20",
        "TEST.EVAL_PERIOD", "0",
        "LOG_PERIOD", str(max(1, min(20, iterations // 24))),
        "OUTPUT_DIR", output_dir,
    ] + list(recipe.overrides)  # fmt: skip
    if cell.seed is not None:
        overrides += ["SEED", str(cell.seed)]
    if period is not None:
        overrides += ["SOLVER.PMD.PERIOD", str(period), "SOLVER.PMD.DECAY", cell.pmd_decay]
    if cell.agvm:
        overrides += ["SOLVER.AGVM.ENABLED", "True"]
        if cell.agvm_period is not None:
            overrides += ["SOLVER.AGVM.PERIOD", str(cell.agvm_period)]
        if cell.agvm_momentum is not None:
            overrides += ["SOLVER.AGVM.MOMENTUM", repr(cell.agvm_momentum)]
    return Plan(cell, iterations, warmup, steps, lr, period, overrides)


CSV_FIELDS = [
    "cell", "optimizer", "batch", "ims_per_device", "accumulation", "lr_rule", "lr",
    "warmup_iters", "iterations", "epochs", "pmd_period", "pmd_decay", "agvm",
    "wall_clock_s", "images_per_s", "box_ap", "ap50", "ap75", "diverged", "final_loss",
    "device", "threads", "output_dir", "seed", "warmup_epochs", "lr_factor", "holdout_ap",
    "holdout_ap50",
]  # fmt: skip


def read_done(csv_path: str) -> Dict[str, dict]:
    if not os.path.exists(csv_path):
        return {}
    with open(csv_path, newline="") as f:
        return {row["cell"]: row for row in csv.DictReader(f)}


def append_row(csv_path: str, row: dict) -> None:
    """Append under an exclusive lock (several study processes may share the file)."""
    with open(csv_path, "a", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
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


HOLDOUT_SET = "shapes_holdout_val"


def final_ap(metrics: Sequence[dict], test_set: str, only_named: bool = False) -> Dict[str, str]:
    """The last AP, AP50 and AP75 (percent, two decimals) of ``test_set`` in a run's
    metrics.json rows. With one test set Detectron2 writes them without the set's name
    (``bbox/AP``), which counts unless ``only_named``. Empty strings where there are none."""
    ap = {k: "" for k in ("AP", "AP50", "AP75")}
    for m in metrics:
        for k in ap:
            keys = [f"{test_set}/bbox/{k}"] + ([] if only_named else [f"bbox/{k}"])
            for key in keys:
                if key in m:
                    # Detectron2 reports NaN when the model detects nothing: COCO AP 0
                    value = m[key]
                    ap[k] = f"{value:.2f}" if math.isfinite(value) else "0.00"
                    break
    return ap


_SPEED = re.compile(r"Overall training speed: (\d+) iterations in \S+ \(([\d.]+) s / it\)")


def summarize(
    plan: Plan, run_dir: str, log_text: str, returncode: int, wall: float, args
) -> Optional[dict]:
    """The CSV row of a finished run, or None when it failed for a reason other than
    divergence."""
    metrics = read_metrics(os.path.join(run_dir, "metrics.json"))
    # the divergence guard (largedet.engine.DivergenceGuard) and Detectron2's own
    # non-finite checks (loss; RPN proposals) all raise FloatingPointError
    diverged = returncode != 0 and "FloatingPointError" in log_text
    if returncode != 0 and not diverged:
        return None
    ap = final_ap(metrics, args.grid_obj.report_set)
    holdout = final_ap(metrics, HOLDOUT_SET, only_named=True)
    if not diverged and ap["AP"] == "":
        return None
    losses = [m["total_loss"] for m in metrics if "total_loss" in m]
    speed = _SPEED.findall(log_text)
    images_per_s = plan.cell.batch / float(speed[-1][1]) if speed else ""
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
        "iterations": plan.iterations,
        "epochs": f"{args.grid_obj.epochs * plan.cell.epochs_factor:g}",
        "pmd_period": plan.pmd_period or "",
        "pmd_decay": plan.cell.pmd_decay if plan.pmd_period else "",
        "agvm": "yes" if plan.cell.agvm else "no",
        "wall_clock_s": f"{wall:.1f}",
        "images_per_s": f"{images_per_s:.2f}" if images_per_s != "" else "",
        "box_ap": "" if diverged else ap["AP"],
        "ap50": "" if diverged else ap["AP50"],
        "ap75": "" if diverged else ap["AP75"],
        "diverged": "yes" if diverged else "no",
        "final_loss": f"{losses[-1]:.4f}" if losses else "",
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
    """Run tools/train_net.py on the grid's config with ``overrides`` (resuming from
    ``run_dir``'s last checkpoint if there is one); its output goes to run_dir/study_log.txt.
    Returns the exit status, the log text and the wall-clock seconds of the whole run:
    those of earlier, interrupted invocations too (kept in ``run_dir/study_wall_clock_s``,
    updated every 30 s, so a killed invocation loses at most that)."""
    os.makedirs(run_dir, exist_ok=True)
    cmd = [sys.executable, TRAIN_NET, "--config", os.path.join(ROOT, args.grid_obj.config)]
    if args.num_gpus > 1:
        cmd += ["--num-gpus", str(args.num_gpus)]
    resuming = os.path.exists(os.path.join(run_dir, "last_checkpoint"))
    if resuming:
        cmd.append("--resume")
    cmd += list(overrides)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    log_path = os.path.join(run_dir, "study_log.txt")
    before = _read_wall_clock(run_dir) if resuming else 0.0
    start = time.perf_counter()
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                _write_wall_clock(run_dir, before + time.perf_counter() - start)
    wall = before + time.perf_counter() - start
    _write_wall_clock(run_dir, wall)
    with open(log_path) as f:
        text = f.read()
    return proc.returncode, text, wall


def run_cell(plan: Plan, run_dir: str, args) -> Tuple[int, str, float]:
    return train(plan.overrides, run_dir, args)


BACKBONE_PREFIX = "backbone.bottom_up."


def ensure_pretrained(args) -> Optional[str]:
    """The grid's pretrained backbone file (trained once, shared by every cell and every
    study process), or None when the grid trains from scratch."""
    grid = args.grid_obj
    if grid.pretrain is None:
        return None
    run_dir = os.path.join(args.output_dir, "pretrain")
    path = os.path.join(run_dir, "backbone.pth")
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

            model = torch.load(os.path.join(run_dir, "model_final.pth"), map_location="cpu")[
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
    """Copy what the README's table and figures need of a finished cell (its config and
    metrics.json) to ``dest``, where it is committed."""
    os.makedirs(dest, exist_ok=True)
    for name in ("config.yaml", "metrics.json"):
        src = os.path.join(run_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))


def main(argv=None) -> int:
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
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
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
    done = read_done(csv_path)
    if not args.dry_run and any(p.cell.name not in done for p in plans):
        weights = ensure_pretrained(args)
        if weights:
            for p in plans:
                p.overrides += ["MODEL.WEIGHTS", weights]
    print(
        f"batch-scaling study ({args.grid} grid): {len(plans)} cells, {sum(p.cell.name in done for p in plans)} done; CSV {csv_path}"
    )
    if args.dry_run:
        for p in plans:
            mark = "done" if p.cell.name in done else "todo"
            print(
                f"  [{mark}] {p.cell.name:32s} lr {p.lr:<10.5g} iterations {p.iterations:5d} warmup {p.warmup:4d} steps {p.steps} T {p.pmd_period or '-'}"
            )
        return 0
    failures, finished, started = [], 0, time.time()
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
        try:
            print(
                f"[{index + 1}/{len(todo)}] {name}: {plan.iterations} iterations at LR {plan.lr:.4g} ...",
                flush=True,
            )
            returncode, text, wall = run_cell(plan, run_dir, args)
            row = summarize(plan, run_dir, text, returncode, wall, args)
            if row is None:
                failures.append(name)
                tail = "\n".join(text.strip().splitlines()[-5:])
                print(
                    f"    FAILED (exit {returncode}); see {run_dir}/study_log.txt:\n{tail}",
                    flush=True,
                )
                continue
            append_row(csv_path, row)
            if args.archive:
                archive_cell(run_dir, os.path.join(args.archive, name))
            finished += 1
            elapsed = time.time() - started
            eta = elapsed / finished * (len(todo) - index - 1)
            result = "diverged" if row["diverged"] == "yes" else f"box AP {row['box_ap']}"
            print(
                f"    {result}, {row['images_per_s']} images/s, {wall / 60:.1f} min; ETA of the rest {eta / 60:.0f} min",
                flush=True,
            )
        finally:
            os.remove(lock)
    if failures:
        print(
            f"{len(failures)} cell(s) failed and will be retried on the next run: {', '.join(failures)}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
