"""The batch-scaling study's schema: its grids, cells, per-cell plan and CSV columns.

``study/batch_scaling_study.py`` runs the cells (one ``tools/train_net.py`` per cell)
and :mod:`largedet_study.plotting` draws the CSV it writes; both take the names and
columns from here. Two CPU grids on the shapes data at 64 px:

* ``steps`` (steps-matched): 200 epochs of 1536 images for every batch, so batch 1024
  gets 300 optimizer steps; warm-up 40 epochs; held-out split to choose on, ``shapes_val``
  to report;
* ``short`` (short budget): 16 epochs for every batch, so batch 1024 gets 24 steps;

* ``regime`` (COCO's regime): batch / training images and epochs as LargeDet's on COCO
  (batch 1056 = 0.9% of COCO's 117,266 images, 12 epochs at 1x, 17 at 1.4x): 24,576
  images, the large batch 256 = 1.04% of them, 12 epochs at 1.0x (1,152 steps at 256);

and ``gpu``, the steps-matched grid at a larger scale for one GPU (R18-FPN at 128 px, 4096
images, 75 epochs: 300 steps at batch 1024), its backbone pre-trained on the device.

How each cell is set (see :func:`plan_cell`):
  * iterations = epochs x training images / batch; warm-up in epochs of images (at least
    3 steps, at most half the run); LR x0.1 at 3/4 and 11/12 of the run;
  * peak LR = the optimizer's reference LR at batch 16 scaled by its rule
    (:data:`largedet.solver.plan.LSR_RULES`): linear for SGD, square root for the adaptive ones;
  * PMD-LAMB's period T = a quarter of the run's iterations unless the cell sets it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from detectron2.config import CfgNode, get_cfg

from largedet.config import add_largedet_config
from largedet.solver.batch import per_device_batch
from largedet.solver.plan import RunPlan, run_plan
from .naming import cell_name, choice_tag, factor_tag, value_tag

#: the checkout (study/largedet_study/ -> two levels up)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

__all__ = [
    "CSV_FIELDS",
    "GRID_NAMES",
    "HOLDOUT_SET",
    "OPTIMIZERS",
    "REFERENCE_BATCH",
    "Cell",
    "CellNumbers",
    "Grid",
    "OptimizerRecipe",
    "Plan",
    "build_grid",
    "cell_kind",
    "final_ap",
    "cell_config",
    "cell_numbers",
    "cell_run_plan",
    "plan_cell",
    "recipe_overrides",
    "run_steps",
    "warmup_steps",
]


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
# a cell's LR schedule after warm-up -> Detectron2's SOLVER.LR_SCHEDULER_NAME
LR_SCHEDULES = {"step": "WarmupMultiStepLR", "cosine": "WarmupCosineLR", "wsd": "WarmupStableDecayLR"}


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
    # the LR after warm-up: "step" (x0.1 at 3/4 and 11/12 of the run, Detectron2's),
    # "cosine" (from the peak to 0 over the run, Detectron2's WarmupCosineLR) or "wsd"
    # (warm-up-stable-decay: the peak to 80% of the run, then linear to 0)
    lr_schedule: str = "step"
    weight_decay: Optional[float] = None  # None: the recipe's
    beta2: Optional[float] = None  # LAMB / PMD-LAMB's beta2; None: the config's (0.999)
    # model EMA: the decay per step at batch 16 (scaled to the cell's batch), evaluated
    # on the average (the trained weights' AP too, under model/ in metrics.json)
    ema: Optional[float] = None
    # batch ramp: (batch, until epoch) stages before the cell's batch, at equal epochs
    ramp: Tuple[Tuple[int, float], ...] = ()
    # gradient-norm bound around the end of warm-up (SOLVER.WARMUP_CLIP, 50 steps each side)
    clip: Optional[float] = None

    @property
    def name(self) -> str:
        pmd = None
        if self.pmd_period is not None or self.pmd_decay != "cosine":
            pmd = f"T{self.pmd_period or 'auto'}-{self.pmd_decay}"
        ramp = ("ramp" + "-".join(f"{b}e{e:g}" for b, e in self.ramp)) if self.ramp else None
        agvm_estimates = None
        if self.agvm and self.agvm_period is not None:
            agvm_estimates = f"p{self.agvm_period}m{self.agvm_momentum:g}"
        return cell_name([self.optimizer, f"bs{self.batch}"], [
            factor_tag("ep", self.epochs_factor, "x"),
            value_tag("wu", self.warmup_epochs),
            pmd,
            factor_tag("lrx", self.lr_factor),
            choice_tag("lr", self.lr_schedule, "step"),
            value_tag("wd", self.weight_decay),
            value_tag("b2", self.beta2),
            value_tag("ema", self.ema),
            ramp,
            value_tag("clip", self.clip),
            "agvm" if self.agvm else None,
            agvm_estimates,
        ], self.seed)  # fmt: skip


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
    # the cells of the optimizer x batch table (a subset of ``cells``); the rest are
    # sweeps, AGVM, longer schedules and second seeds
    main: Tuple[Cell, ...] = ()
    # False: a cell's images must be whole batches; True: its steps are the nearest whole
    # number (the regime grid's 1.4x = 16.8 epochs of 24,576 images: 1,612.8 -> 1,613 at 256)
    round_steps: bool = False

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
# at batch 1024 in a calibration run (docs/pmd_lamb.md, "Learning rate"), 0.04 trained.
STEPS_OPTIMIZERS: Dict[str, OptimizerRecipe] = {
    "sgd": OPTIMIZERS["sgd"],
    "lamb": OptimizerRecipe("LAMB", 0.005, "sqrt"),
    "pmd_lamb": OptimizerRecipe("PMD_LAMB", 0.005, "sqrt"),
    "adamw": OptimizerRecipe("AdamW", 5e-4, "sqrt", weight_decay=0.05),
}

# what every grid on the shapes data at 64 px evaluates: the held-out split (the val
# split of the seed-1000 data, never trained on) chooses the recipe, shapes_val reports it
_TEST_SETS = ("DATASETS.TEST", "('shapes_holdout_val', 'shapes_val')")


def _steps_main() -> List[Cell]:
    return [
        Cell("sgd", 16, warmup_epochs=2),
        Cell("sgd", 256),
        Cell("sgd", 1024),
        Cell("pmd_lamb", 256),
        Cell("pmd_lamb", 1024),
        Cell("lamb", 1024),
        Cell("adamw", 1024),
    ]


def _steps_cells() -> List[Cell]:
    """The steps-matched grid, in the order two study processes take them: the baseline
    and the first batch-1024 cells, then the LR and warm-up of PMD-LAMB at 1024 (its first
    run under-fits: training loss 0.28 at the end against the baseline's 0.12), the other
    optimizers at 1024, batch 256, the second seeds, and the rest of the sweeps."""
    return [
        # the baseline: Detectron2's SGD at batch 16 with its short warm-up (2 epochs)
        Cell("sgd", 16, warmup_epochs=2),
        Cell("pmd_lamb", 1024),
        Cell("sgd", 1024),
        Cell("pmd_lamb", 1024, epochs_factor=1.4),  # LargeDet's longer schedule
        Cell("lamb", 1024),
        Cell("pmd_lamb", 1024, lr_factor=2.0),
        Cell("pmd_lamb", 1024, warmup_epochs=80),
        Cell("adamw", 1024),
        Cell("pmd_lamb", 256),
        Cell("sgd", 256),
        Cell("pmd_lamb", 1024, agvm=True),
        # second seeds of the cells the conclusion rests on
        Cell("sgd", 16, warmup_epochs=2, seed=1),
        Cell("pmd_lamb", 1024, seed=1),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, seed=1),
        # the rest of the sweeps
        Cell("pmd_lamb", 1024, lr_factor=0.5),
        Cell("pmd_lamb", 1024, warmup_epochs=20),
        Cell("pmd_lamb", 1024, pmd_period=38),  # T = 1/8 of the run (default 1/4: 75)
        Cell("pmd_lamb", 1024, pmd_period=150),  # T = 1/2 of the run
        Cell("pmd_lamb", 1024, lr_factor=2.0, warmup_epochs=80),
        Cell("sgd", 1024, seed=1),
        # between the LR that trains (x1) and the one that stops learning (x2)
        Cell("pmd_lamb", 1024, lr_factor=1.5),
        # the LR's decay: LR x1.5 trains to a higher loss than both seeds at x1 from step 95
        # on and LR x2 stops learning, so the steps are large enough; the step schedule
        # keeps the peak LR for 3/4 of the run, a cosine one anneals from the start
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="cosine"),
        Cell("pmd_lamb", 1024, lr_schedule="cosine"),
        # the epochs-to-parity curve: the 1.0x/1.4x recipe at 2.0x and 1.7x the epochs,
        # two seeds each (the longest first)
        Cell("pmd_lamb", 1024, epochs_factor=2.0),
        Cell("pmd_lamb", 1024, epochs_factor=1.7),
        Cell("pmd_lamb", 1024, epochs_factor=2.0, seed=1),
        Cell("pmd_lamb", 1024, epochs_factor=1.7, seed=1),
        # the untried axes, one change each against the 1.4x row (same seed): LAMB's own
        # weight decay and a larger one; warm-up-stable-decay; model EMA (0.9998 per step
        # at batch 16 = 0.9873 at 1024, ~80 steps); a ramp 256 -> 512 -> 1024 over the
        # first 20% of the epochs (168 + 84 steps, then 336 at 1024: 280 epochs in all);
        # a lower beta2 with the larger LRs that stop learning or fit less at 0.999
        Cell("pmd_lamb", 1024, epochs_factor=1.4, weight_decay=0.01),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd"),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, ema=0.9998),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, ramp=((256, 28.0), (512, 56.0))),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, weight_decay=0.05),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, beta2=0.99, lr_factor=1.5),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, beta2=0.95, lr_factor=2.0),
        # the best combination of the single changes measured at 1.4x (seed 0, held-out:
        # warm-up-stable-decay +0.44, weight decay 0.01 +0.30 against the same machine's
        # 72.51), two seeds, at 1.4x and at 1.0x the epochs (the moonshot)
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd", weight_decay=0.01),
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd", weight_decay=0.01, seed=1),
        Cell("pmd_lamb", 1024, lr_schedule="wsd", weight_decay=0.01),
        Cell("pmd_lamb", 1024, lr_schedule="wsd", weight_decay=0.01, seed=1),
        # model EMA on top of that recipe at 1.4x (seed 0; evaluated on both the average
        # and the trained weights, so the trained weights repeat the row above it)
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd", weight_decay=0.01, ema=0.9998),
        # gradient clipping around the end of warm-up (steps 10-109, the default window) at
        # the norm the 1.4x row's gradient had in warm-up (4.4-6.0 at the logged steps 16-50),
        # cutting the rise after it (6.1 at step 67, 15.9-20.8 at steps 84-118) back to that
        Cell("pmd_lamb", 1024, epochs_factor=1.4, clip=5.0),
        # the batch ramp on top of that recipe at 1.4x (seed 0): 256 to epoch 28, 512 to 56,
        # then 1024, at equal epochs (588 steps instead of 420)
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd", weight_decay=0.01,
             ramp=((256, 28.0), (512, 56.0))),
        # the recipe's own epoch price: warm-up-stable-decay + weight decay 0.01 at 1.7x the
        # epochs (510 steps), two seeds, beside its 1.0x and 1.4x rows
        Cell("pmd_lamb", 1024, epochs_factor=1.7, lr_schedule="wsd", weight_decay=0.01),
        Cell("pmd_lamb", 1024, epochs_factor=1.7, lr_schedule="wsd", weight_decay=0.01, seed=1),
        # the recipe's third seed at 1.4x: its gain over the step schedule's 1.4x rows is
        # inside the seed spread on shapes_val with two
        Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd", weight_decay=0.01, seed=2),
    ]


# The regime grid's large batch and its 4x: 256 and 1024 of 24,576 images (1.04% and 4.2%
# per step, LargeDet's 1056 on COCO 0.9%, MLPerf's 4096 on COCO 3.5%).
REGIME_BATCH = 256
REGIME_NUM_TRAIN = 24576
# the baseline's warm-up: Detectron2's 1000 steps of 16 images (0.65 epoch of 24,576 images)
_REGIME_BASELINE = Cell("sgd", 16, warmup_epochs=0.65)
# the baseline with the large batch's LR schedule (warm-up-stable-decay), weight decay 1e-4
_STRONG_BASELINE = replace(_REGIME_BASELINE, lr_schedule="wsd")
# the configs' recipe (warm-up-stable-decay, weight decay 0.01) and the study's first
# (step LR, weight decay 1e-4), each at 1.0x and 1.4x the epochs
_WSD = dict(lr_schedule="wsd", weight_decay=0.01)


def _regime_main() -> List[Cell]:
    b = REGIME_BATCH
    return [
        _REGIME_BASELINE,
        Cell("pmd_lamb", b),
        Cell("pmd_lamb", b, epochs_factor=1.4),
        Cell("pmd_lamb", b, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4, **_WSD),
        Cell("sgd", b),
        Cell("pmd_lamb", 4 * b, **_WSD),
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, **_WSD),
    ]


def _regime_cells() -> List[Cell]:
    """The regime grid, in the order two study processes take them: the baseline and the
    configs' recipe at 1.4x and 1.0x first (the README's headline), the study's first
    recipe, then the second seeds, SGD with the linear rule, 4x the batch, the configs'
    recipe's third seed at 1.0x, the axes at 4x the batch and 1.4x, and the configs' recipe
    at 2x the epochs (three seeds)."""
    b = REGIME_BATCH
    return [
        _REGIME_BASELINE,
        Cell("pmd_lamb", b, epochs_factor=1.4, **_WSD),
        Cell("pmd_lamb", b, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4),
        Cell("pmd_lamb", b),
        # second seeds of the baseline and the four PMD-LAMB cells
        replace(_REGIME_BASELINE, seed=1),
        Cell("pmd_lamb", b, epochs_factor=1.4, seed=1, **_WSD),
        Cell("pmd_lamb", b, seed=1, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4, seed=1),
        Cell("pmd_lamb", b, seed=1),
        # does SGD with the linear rule (LR 0.32) still diverge when the batch is 1% of the data?
        Cell("sgd", b),
        # 4x the batch: 4.2% of the data per step (288 steps at 1.0x, 403 at 1.4x)
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, **_WSD),
        Cell("pmd_lamb", 4 * b, **_WSD),
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, seed=1, **_WSD),
        Cell("pmd_lamb", 4 * b, seed=1, **_WSD),
        # a third seed of the configs' recipe at 1.0x, whose margin over the baseline (+0.13
        # shapes_val, +0.02 held-out) is under the seed spread
        Cell("pmd_lamb", b, seed=2, **_WSD),
        # 4x the batch at 1.4x ends 3.2 AP below the baseline held-out (3.6 on shapes_val):
        # the axes the steps grid tried at 1.4x, one change each against that row (seed 0).
        # The LR: the square-root rule's value x1.5 (0.06).
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, lr_factor=1.5, **_WSD),
        # a batch ramp: 256 for the first 10% of the epochs, 512 to 20%, then 1024 (the steps
        # grid's 28 and 56 of 280 epochs), at equal epochs: 162 + 81 + 322 = 565 steps
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, ramp=((b, 1.68), (2 * b, 3.36)), **_WSD),
        # model EMA, 0.9998 per step of 16 images (0.98728 per step of 1024: about 79 steps)
        Cell("pmd_lamb", 4 * b, epochs_factor=1.4, ema=0.9998, **_WSD),
        # the steps grid's AP turned down past 1.7x (2x: 400 passes over its 1536 images);
        # does it at 1% of the data? The configs' recipe at 2x (24 epochs, 2304 steps)
        Cell("pmd_lamb", b, epochs_factor=2.0, **_WSD),
        # its second and third seeds: 2x against 1.4x is the difference the 2x turn is read
        # from, and two seeds put it at about the seed spread
        Cell("pmd_lamb", b, epochs_factor=2.0, seed=1, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=2.0, seed=2, **_WSD),
        # the strong baseline: batch 16 with the large batch's schedule (warm-up-stable-decay,
        # SGD's own coupled weight decay 1e-4 kept: LAMB's decoupled 0.01 is another thing),
        # three seeds; the step-LR baseline's and the 1.4x recipe's third seeds; batch 16's LR
        # (0.02, never swept) at x0.5 and x2 with the better schedule, one seed
        _STRONG_BASELINE,
        replace(_REGIME_BASELINE, seed=2),
        replace(_STRONG_BASELINE, seed=1),
        Cell("pmd_lamb", b, epochs_factor=1.4, seed=2, **_WSD),
        replace(_STRONG_BASELINE, seed=2),
        replace(_STRONG_BASELINE, lr_factor=0.5),
        replace(_STRONG_BASELINE, lr_factor=2.0),
        # LR 0.04 led the held-out split on seed 0, above LR 0.02's three-seed mean (the
        # regime CSV): its second and third seeds, for a baseline of three
        replace(_STRONG_BASELINE, lr_factor=2.0, seed=1),
        replace(_STRONG_BASELINE, lr_factor=2.0, seed=2),
        # equal tuning at batch 256, 1.0x (seed 0 per candidate, the held-out split chooses):
        # LAMB without the periodic moment decay on the configs' recipe (does the decay earn
        # its place?), and the recipe's LR at x2 and x0.5 of 0.02 (one change per cell)
        Cell("lamb", b, **_WSD),
        Cell("pmd_lamb", b, lr_factor=2.0, **_WSD),
        Cell("pmd_lamb", b, lr_factor=0.5, **_WSD),
        # batch 16's LR 0.04 led its sweep at the edge: 0.08 brackets it
        replace(_STRONG_BASELINE, lr_factor=4.0),
        # the rest of batch 256's equal budget at 1.0x, seed 0 each, one change per cell
        # against the configs' recipe: LAMB's own LR at x2 and x0.5; the warm-up x2 (461
        # steps); the PMD period at 1/8 and 1/2 of the run (144 and 576 steps; 1/4 is the
        # recipe's); AGVM on; warm-up-stable-decay with SGD's weight decay 1e-4 kept
        Cell("lamb", b, lr_factor=2.0, **_WSD),
        Cell("lamb", b, lr_factor=0.5, **_WSD),
        Cell("pmd_lamb", b, warmup_epochs=4.8, **_WSD),
        Cell("pmd_lamb", b, pmd_period=144, **_WSD),
        Cell("pmd_lamb", b, pmd_period=576, **_WSD),
        Cell("pmd_lamb", b, agvm=True, **_WSD),
        Cell("pmd_lamb", b, lr_schedule="wsd"),
        # SGD at 256: the linear rule's 0.32 diverged (sgd-bs256); warm-up-stable-decay with
        # the LR swept down from it (0.16, 0.08, 0.04) and the warm-up x2
        Cell("sgd", b, lr_schedule="wsd", lr_factor=0.5),
        Cell("sgd", b, lr_schedule="wsd", lr_factor=0.25),
        Cell("sgd", b, lr_schedule="wsd", lr_factor=0.125),
        Cell("sgd", b, lr_schedule="wsd", lr_factor=0.25, warmup_epochs=4.8),
        # on the AMX Xeon LR 0.08 led batch 16's held-out split by 0.14 over 0.04, again at
        # the edge: 0.16 brackets it
        replace(_STRONG_BASELINE, lr_factor=8.0),
        # LR 0.16 fell 1.19 below 0.08 held-out: batch 16's optimum on the AMX Xeon is
        # bracketed at 0.08; its second and third seeds, for a baseline of three on that class
        replace(_STRONG_BASELINE, lr_factor=4.0, seed=1),
        replace(_STRONG_BASELINE, lr_factor=4.0, seed=2),
        # PMD-LAMB's LR: 0.01 led 0.02 by 0.01 held-out and 0.04 fell 5.3, so the best sits
        # at the sweep's low edge: 0.005 brackets it
        Cell("pmd_lamb", b, lr_factor=0.25, **_WSD),
        # LAMB's LR: 0.01 led 0.02 by 1.30 held-out on the AMX Xeon (seed 0), at the low edge
        # of its sweep: 0.005 brackets it
        Cell("lamb", b, lr_factor=0.25, **_WSD),
        # LR 0.01 (x0.5), LAMB's choice on Xeon-AMX and EPYC-Zen5 and PMD-LAMB's on Xeon-AMX
        # (seed 0): three seeds at 1.0x and at 1.4x the epochs, for the optimizer table's
        # rows with intervals (PMD-LAMB's choice on EPYC-Zen5, 0.02, has its seeds above)
        Cell("lamb", b, lr_factor=0.5, seed=1, **_WSD),
        Cell("pmd_lamb", b, lr_factor=0.5, seed=1, **_WSD),
        Cell("lamb", b, lr_factor=0.5, seed=2, **_WSD),
        Cell("pmd_lamb", b, lr_factor=0.5, seed=2, **_WSD),
        Cell("lamb", b, epochs_factor=1.4, lr_factor=0.5, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4, lr_factor=0.5, **_WSD),
        Cell("lamb", b, epochs_factor=1.4, lr_factor=0.5, seed=1, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4, lr_factor=0.5, seed=1, **_WSD),
        Cell("lamb", b, epochs_factor=1.4, lr_factor=0.5, seed=2, **_WSD),
        Cell("pmd_lamb", b, epochs_factor=1.4, lr_factor=0.5, seed=2, **_WSD),
    ]


def _gpu_main() -> List[Cell]:
    return [
        # the baseline's warm-up: Detectron2's, 192 steps at batch 16 (0.75 epoch here)
        Cell("sgd", 16, warmup_epochs=0.75),
        Cell("pmd_lamb", 1024),
        Cell("sgd", 1024),
        Cell("lamb", 1024),
        Cell("adamw", 1024),
        Cell("pmd_lamb", 256),
        Cell("sgd", 256),
    ]


def _gpu_cells() -> List[Cell]:
    """The GPU grid, most telling first: the baseline, the batch-1024 cells and the 1.4x
    schedule, then the other optimizers and batch 256."""
    main = _gpu_main()
    return main[:3] + [Cell("pmd_lamb", 1024, epochs_factor=1.4)] + main[3:]


GRID_NAMES = ("steps", "short", "gpu", "regime")


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
            main=tuple(_steps_main()),
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
            main=tuple(_main_grid(batches)),
            pretrain=pretrain_1536,
        )
    if name == "regime":
        # COCO's regime: the same detector, pre-trained backbone and evaluation as the
        # steps grid, only N, the epochs and the batch changed. 24,576 training images, 12
        # epochs at 1.0x (294,912 images: 18,432 steps at batch 16, 1,152 at 256, 288 at
        # 1024), 16.8 at 1.4x (1,613 steps at 256); warm-up 2.4 epochs (20% of the 1.0x
        # run, as the steps grid's 40 of 200; 230 steps at 256), the baseline Detectron2's
        # 1000 steps; 2000 images of each test split evaluated at the end of every cell.
        return Grid(
            config="configs/shapes/study/Base-Study-R10w16-FPN-64px.yaml",
            num_train=REGIME_NUM_TRAIN,
            epochs=12,
            ims_per_device=16,
            cells=tuple(_regime_cells()),
            main=tuple(_regime_main()),
            extra_overrides=_TEST_SETS + ("DATASETS.SHAPES.NUM_VAL", "2000"),
            pretrain=pretrain_1536,
            warmup_epochs=2.4,
            optimizers=STEPS_OPTIMIZERS,
            round_steps=True,
        )
    if name == "gpu":
        # The steps-matched grid on one GPU: Faster R-CNN R18-FPN (64-512 channels) at
        # 128 px, 75 epochs of 4096 images for every batch (307,200 images: batch 1024
        # takes 300 steps, batch 16 19,200), warm-up 15 epochs (20% of the run), AMP bf16,
        # 16 images per pass as on the CPU (BN over the same 16 at every batch). The ResNet
        # is pre-trained on the device on another 4096 images (seed 1000): nothing is
        # downloaded (a GPU machine here has no internet).
        return Grid(
            config="configs/shapes/Base-Shapes-R18-FPN.yaml",
            num_train=4096,
            epochs=75,
            ims_per_device=16,
            cells=tuple(_gpu_cells()),
            main=tuple(_gpu_main()),
            extra_overrides=_TEST_SETS + (
                "DATASETS.SHAPES.IMAGE_SIZE", "128", "SOLVER.AMP.ENABLED", "True",
                "SOLVER.AMP.PRECISION", "bfloat16", "DATALOADER.NUM_WORKERS", "6",
            ),
            # 16 epochs of the seed-1000 images at batch 16 with SGD (4096 steps)
            pretrain=(
                "DATASETS.SHAPES.SEED", "1000", "DATASETS.SHAPES.NUM_TRAIN", "4096",
                "DATASETS.TEST", "()", "SOLVER.OPTIMIZER", "SGD", "SOLVER.IMS_PER_BATCH", "16",
                "SOLVER.IMS_PER_DEVICE", "16", "SOLVER.BASE_LR", "0.02",
                "SOLVER.MAX_ITER", "4096", "SOLVER.STEPS", "(3072, 3755)",
                "SOLVER.WARMUP_ITERS", "192", "SOLVER.CHECKPOINT_PERIOD", "1024",
            ),
            warmup_epochs=15.0,
            optimizers=STEPS_OPTIMIZERS,
        )  # fmt: skip
    raise ValueError(f"--grid must be one of {GRID_NAMES}, got {name!r}")


def cell_kind(name: str) -> str:
    """What a cell of any grid is, by its name: ``"main"`` (a cell of the optimizer x batch
    table), ``"agvm"`` (a main cell with AGVM on and nothing else changed) or ``"extra"``
    (sweeps, longer schedules, second seeds, cells of no grid)."""
    for grid_name in GRID_NAMES:
        for cell in build_grid(grid_name).main:
            if name == cell.name:
                return "main"
            if name == replace(cell, agvm=True).name:
                return "agvm"
    return "extra"


@dataclass
class Plan:
    """Everything derived for one cell: what the run does and the overrides that say so."""

    cell: Cell
    iterations: int
    warmup: int
    steps: Optional[Tuple[int, int]]  # the LR drops; None with the cosine schedule
    lr: float
    pmd_period: Optional[int]
    overrides: List[str] = field(default_factory=list)
    # the optimizer steps the run takes: ``iterations`` (SOLVER.MAX_ITER, steps of the full
    # batch) unless a batch ramp runs more, smaller ones first
    optimizer_steps: Optional[int] = None


def cell_config(config: str, overrides: Sequence[str], new_config: Callable[[], CfgNode] = None) -> CfgNode:
    """The config a cell trains with: ``config`` (a path in the checkout) with the cell's
    ``overrides``, on the keys of ``new_config()`` (default: Detectron2's and largedet's)."""
    cfg = new_config() if new_config is not None else add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(ROOT, config))
    cfg.merge_from_list(list(overrides))
    return cfg


def cell_run_plan(config: str, overrides: Sequence[str], world: int, dataset_size: int,
                  new_config: Callable[[], CfgNode] = None) -> RunPlan:  # fmt: skip
    """The trainer's run plan (:func:`largedet.solver.plan.run_plan`) of a cell's config on
    ``world`` processes: the cell's LR and batch arithmetic are the trainer's, not a copy."""
    return run_plan(cell_config(config, overrides, new_config), world, dataset_size)


def recipe_overrides(recipe: OptimizerRecipe, batch: int, per_device: int, lr_factor: float,
                     weight_decay: Optional[float], iterations: int, warmup: int,
                     output_dir: str) -> List[str]:  # fmt: skip
    """The overrides every study cell (detection and video) sets: the optimizer and its LR
    rule from ``recipe`` (the reference LR x ``lr_factor``), the global and per-device batch,
    the weight decay (None: the recipe's), the run's length and warm-up, about ten
    checkpoints a run (an interrupted cell loses at most a tenth of it), about 24 log lines
    and the output folder; then the recipe's own overrides."""
    return [
        "SOLVER.OPTIMIZER", recipe.name,
        "SOLVER.IMS_PER_BATCH", str(batch),
        "SOLVER.IMS_PER_DEVICE", str(per_device),
        "SOLVER.LSR.ENABLED", "True",
        "SOLVER.LSR.RULE", recipe.rule,
        "SOLVER.LSR.REFERENCE_BATCH", str(REFERENCE_BATCH),
        "SOLVER.LSR.REFERENCE_LR", repr(recipe.reference_lr * lr_factor),
        "SOLVER.WEIGHT_DECAY", repr(recipe.weight_decay if weight_decay is None else weight_decay),
        "SOLVER.MAX_ITER", str(iterations),
        "SOLVER.WARMUP_ITERS", str(warmup),
        "SOLVER.CHECKPOINT_PERIOD", str(max(1, iterations // 10)),
        "LOG_PERIOD", str(max(1, min(20, iterations // 24))),
        "OUTPUT_DIR", output_dir,
    ] + list(recipe.overrides)  # fmt: skip


def run_steps(name: str, epochs: float, num_train: int, batch: int, round_steps: bool = False) -> int:
    """The steps of batch ``batch`` in ``epochs`` epochs of ``num_train`` samples (cell
    ``name``, detection or video): rounded where ``round_steps``, else a whole number of
    batches or a ValueError naming the cell."""
    images = epochs * num_train
    if round_steps:
        return max(1, round(images / batch))
    if abs(images - round(images)) > 1e-6 or round(images) % batch:
        raise ValueError(
            f"{name}: {epochs:g} epochs x {num_train} samples is not a whole number of batches of {batch}"
        )
    return round(images) // batch


def warmup_steps(warmup_epochs: float, num_train: int, batch: int, iterations: int, minimum: int) -> int:
    """The warm-up's steps: ``warmup_epochs`` epochs of batch ``batch``, at least ``minimum``
    and at most half the run."""
    return min(iterations // 2, max(minimum, round(warmup_epochs * num_train / batch)))


@dataclass(frozen=True)
class CellNumbers:
    """The numbers every study cell (detection and video) derives the same way from its grid
    and itself: the optimizer recipe, the run's steps and warm-up, the per-device batch,
    PMD-LAMB's period and the step schedule's two LR drops."""

    recipe: OptimizerRecipe
    iterations: int
    warmup: int
    per_device: int
    pmd_period: Optional[int]  # PMD-LAMB only
    steps: Optional[Tuple[int, int]]  # x0.1 at 3/4 and 11/12 of the run; None without drops


def cell_numbers(grid, cell, world: int, *, warmup_epochs: Optional[float], schedules: Dict[str, str],
                 min_warmup: int, step_drops: bool) -> CellNumbers:  # fmt: skip
    """:class:`CellNumbers` of ``cell`` (a detection :class:`Cell` or a video cell) in ``grid``
    on ``world`` processes. ``warmup_epochs``: the warm-up of the cells that set none (None:
    the grid's); ``schedules``: the schedule names the cell may take (a ValueError names the
    cell otherwise); ``min_warmup``: the fewest warm-up steps; ``step_drops``: whether the
    run has the step schedule's LR drops."""
    if cell.lr_schedule not in schedules:
        raise ValueError(f"{cell.name}: lr_schedule must be one of {sorted(schedules)}, got {cell.lr_schedule!r}")
    recipe = grid.recipe(cell.optimizer)
    iterations = run_steps(cell.name, grid.epochs * cell.epochs_factor, grid.num_train, cell.batch,
                           getattr(grid, "round_steps", False))  # fmt: skip
    if cell.warmup_epochs is not None:
        warmup_epochs = cell.warmup_epochs
    elif warmup_epochs is None:
        warmup_epochs = grid.warmup_epochs
    warmup = warmup_steps(warmup_epochs, grid.num_train, cell.batch, iterations, min_warmup)
    period = None
    if recipe.name == "PMD_LAMB":
        period = getattr(cell, "pmd_period", None) or max(1, iterations // 4)
    steps = (round(iterations * 3 / 4), round(iterations * 11 / 12)) if step_drops else None
    per_device = per_device_batch(grid.ims_per_device, cell.batch, world)
    return CellNumbers(recipe, iterations, warmup, per_device, period, steps)


def plan_cell(
    grid: Grid, cell: Cell, warmup_epochs: Optional[float], output_dir: str, world: int
) -> Plan:
    """What ``cell`` runs. ``warmup_epochs`` replaces the grid's warm-up for the cells that
    do not set their own (None: the grid's)."""
    numbers = cell_numbers(grid, cell, world, warmup_epochs=warmup_epochs, schedules=LR_SCHEDULES,
                           min_warmup=3, step_drops=cell.lr_schedule == "step")  # fmt: skip
    recipe, iterations, warmup, steps = numbers.recipe, numbers.iterations, numbers.warmup, numbers.steps
    period = numbers.pmd_period
    overrides = list(grid.extra_overrides) + [
        "DATASETS.SHAPES.NUM_TRAIN", str(grid.num_train),
        "SOLVER.LR_SCHEDULER_NAME", LR_SCHEDULES[cell.lr_schedule],
        "SOLVER.STEPS", f"({steps[0]}, {steps[1]})" if steps else "()",
        "SOLVER.BASE_LR_END", "0.0",
        "SOLVER.DIVERGENCE.WINDOW", "20",
        "TEST.EVAL_PERIOD", "0",
    ] + recipe_overrides(recipe, cell.batch, numbers.per_device, cell.lr_factor, cell.weight_decay,
                         iterations, warmup, output_dir)  # fmt: skip
    if cell.seed is not None:
        overrides += ["SEED", str(cell.seed)]
    if cell.beta2 is not None:
        overrides += ["SOLVER.LAMB.BETAS", f"(0.9, {cell.beta2!r})"]
    if cell.ema is not None:
        overrides += ["MODEL_EMA.ENABLED", "True", "MODEL_EMA.DECAY", repr(cell.ema),
                      "MODEL_EMA.REFERENCE_BATCH", str(REFERENCE_BATCH), "MODEL_EMA.EVAL", "both"]  # fmt: skip
    if cell.clip is not None:
        overrides += ["SOLVER.WARMUP_CLIP.MAX_NORM", repr(cell.clip)]
    if cell.ramp:
        batches = ", ".join(str(b) for b, _ in cell.ramp)
        epochs = ", ".join(repr(float(e)) for _, e in cell.ramp)
        overrides += ["SOLVER.BATCH_RAMP.BATCHES", f"({batches},)", "SOLVER.BATCH_RAMP.EPOCHS", f"({epochs},)"]
    if period is not None:
        overrides += ["SOLVER.PMD.PERIOD", str(period), "SOLVER.PMD.DECAY", cell.pmd_decay]
    if cell.agvm:
        overrides += ["SOLVER.AGVM.ENABLED", "True"]
        if cell.agvm_period is not None:
            overrides += ["SOLVER.AGVM.PERIOD", str(cell.agvm_period)]
        if cell.agvm_momentum is not None:
            overrides += ["SOLVER.AGVM.MOMENTUM", repr(cell.agvm_momentum)]
    run = cell_run_plan(grid.config, overrides, world, grid.num_train)
    return Plan(cell, iterations, warmup, steps, run.lr.lr, period, overrides, run.total_steps)


CSV_FIELDS = [
    "cell", "optimizer", "batch", "ims_per_device", "accumulation", "lr_rule", "lr",
    "warmup_iters", "iterations", "epochs", "pmd_period", "pmd_decay", "agvm",
    "wall_clock_s", "images_per_s", "box_ap", "ap50", "ap75", "diverged", "final_loss",
    "device", "threads", "output_dir", "seed", "warmup_epochs", "lr_factor", "holdout_ap",
    "holdout_ap50",
]  # fmt: skip


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
