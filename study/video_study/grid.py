"""The video batch-scaling study's schema: its grid, cells, per-cell plan and CSV columns.

``study/video_batch_study.py`` runs the cells (one ``projects/video/train.py``
per cell, with the detection study's runner, :mod:`largedet_study.runner`) and draws the
CSV. The grid is a miniature of "Training Kinetics in 15 Minutes" (Lin, Gan, Han 2019:
TSM-R50 at 12,288 clips per step = 5.1% of Kinetics-400's 240,000 clips, 100 epochs, SGD
with the linear rule, 5 warm-up epochs, cosine decay, weight decay 1e-4 and none on BN
and biases) on the built-in moving-shapes videos' ``direction_speed`` task:

* 4096 training videos, 1024 validation videos (10 clips x 3 crops each);
* every batch the same epochs (:data:`EPOCHS`, a stated fraction of the paper's 100), the
  same 5 warm-up epochs and a cosine decay to 0;
* batch 256 = 6.25% of the training set per step (16 steps per epoch, the paper's ~20),
  1024 = 25% its 4x; batch 16 the baseline (0.4%).

How each cell is set (:func:`plan_video_cell`): iterations = epochs x 4096 / batch;
warm-up 5 epochs in steps; peak LR = the optimizer's reference LR at batch 16 scaled by
its rule (linear for SGD, square root for PMD-LAMB, as the detection study); PMD-LAMB's
period a quarter of the run. The multigrid cell trains the base batch's epochs on the
long and short cycles (:data:`MULTIGRID_OVERRIDES`), with the step schedule multigrid
needs (x0.1 at 3/4 and 11/12 of the base run); its long cycle multiplies the clips per
step (at base batch 256 the coarsest shape takes 4096 clips a step, the whole training set,
with the LR scaled linearly with it), so it runs fewer steps, and its warm-up is the steps of
its own first 5 epochs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from largedet_video.evaluation import last_classification_metric
from largedet_study.grid import OptimizerRecipe, cell_config, cell_numbers, cell_run_plan, recipe_overrides
from largedet_study.naming import cell_name, choice_tag, factor_tag, value_tag


#: the checkout (study/video_study/ -> four levels up)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
__all__ = [
    "EPOCHS",
    "NUM_TRAIN",
    "VIDEO_CSV_FIELDS",
    "VIDEO_OPTIMIZERS",
    "VIDEO_STAGE_CSV_FIELDS",
    "VideoCell",
    "VideoGrid",
    "VideoPlan",
    "build_video_grid",
    "final_top1",
    "plan_video_cell",
]

#: the study's training videos and epochs (a third of the paper's 100: every cell about
#: 30 minutes on one core of a 2-core Xeon)
NUM_TRAIN = 4096
EPOCHS = 30
WARMUP_EPOCHS = 5.0

#: reference LRs at batch 16. SGD: Detectron2's 0.02 (from scratch; the paper's 0.0025
#: per 16 clips fine-tunes ImageNet weights). PMD-LAMB: the detection study's 0.005 and
#: square-root rule (0.02 at 256).
VIDEO_OPTIMIZERS: Dict[str, OptimizerRecipe] = {
    "sgd": OptimizerRecipe("SGD", 0.02, "linear"),
    "pmd_lamb": OptimizerRecipe("PMD_LAMB", 0.005, "sqrt"),
}

#: multigrid's long cycle (the paper's four shapes: the coarsest 1/4 of the frames at
#: 1/sqrt(2) of the crop, 8x the clips per step) and short cycle, at the base schedule's
#: epochs (EPOCH_FACTOR 1: equal epochs with the other cells)
MULTIGRID_OVERRIDES = (
    "MULTIGRID.LONG_CYCLE", "True",
    "MULTIGRID.SHORT_CYCLE", "True",
    "MULTIGRID.EPOCH_FACTOR", "1.0",
    "MULTIGRID.BN_BASE_SIZE", "8",
)  # fmt: skip


#: a cell's LR schedule after warm-up -> SOLVER.LR_SCHEDULER_NAME
VIDEO_LR_SCHEDULES = {"cosine": "WarmupCosineLR", "wsd": "WarmupStableDecayLR", "step": "WarmupMultiStepLR"}


@dataclass(frozen=True)
class VideoCell:
    """One training run of the video study."""

    optimizer: str
    batch: int
    seed: Optional[int] = None  # SEED of the run; None: the config's (0)
    multigrid: bool = False
    # a multigrid cell's LR at its long cycle's shapes: True grows it with the shape's clips
    # (the linear rule, the paper's), False holds the base shape's (MULTIGRID.SCALE_LR)
    multigrid_scale_lr: bool = True
    # False: the short cycle alone (MULTIGRID.LONG_CYCLE False: the base shape's clips and
    # frames all run long, crops alternate every step, the LR is the base schedule's)
    multigrid_long_cycle: bool = True
    # False: the long cycle alone (MULTIGRID.SHORT_CYCLE False: every step of a long-cycle
    # stage has its one shape)
    multigrid_short_cycle: bool = True
    # True: the long cycle keeps the base frames and shrinks the crop alone, to the paper's
    # voxels per clip (1/8, 1/4, 1/2, 1: crops S x 0.354, 0.5, 0.707, 1;
    # :data:`KEEP_FRAMES_FACTORS`), for a task whose label needs every frame
    multigrid_keep_frames: bool = False
    lr_factor: float = 1.0
    # "TSMResNet", or "TSNResNet" (the same network without the shift: the task's
    # single-frame control, at chance by construction: every class renders the same
    # distribution of single frames)
    backbone: str = "TSMResNet"
    epochs_factor: float = 1.0  # multiplies the grid's epochs
    warmup_epochs: Optional[float] = None  # None: the grid's
    # after warm-up: "cosine" (to 0 over the run, the paper's), "wsd" (the peak to 80% of
    # the run, then linear to 0) or "step" (x0.1 at 3/4 and 11/12, the schedule multigrid
    # needs: a multigrid cell always has it)
    lr_schedule: str = "cosine"

    @property
    def name(self) -> str:
        backbone = [] if self.backbone == "TSMResNet" else [self.backbone[:3].lower()]
        multigrid = None
        if self.multigrid and not self.multigrid_long_cycle:
            multigrid = "multigrid-short"
        elif self.multigrid and not self.multigrid_short_cycle:
            multigrid = "multigrid-long" if self.multigrid_scale_lr else "multigrid-long-lrheld"
        elif self.multigrid:
            multigrid = "multigrid" if self.multigrid_scale_lr else "multigrid-lrheld"
        if multigrid and self.multigrid_keep_frames:
            multigrid += "-keepframes"
        return cell_name([*backbone, self.optimizer, f"bs{self.batch}"], [
            multigrid,
            factor_tag("ep", self.epochs_factor, "x"),
            value_tag("wu", self.warmup_epochs),
            choice_tag("lr", self.lr_schedule, "cosine"),
            factor_tag("lrx", self.lr_factor),
        ], self.seed)  # fmt: skip


@dataclass(frozen=True)
class VideoGrid:
    config: str
    num_train: int
    epochs: float
    warmup_epochs: float
    ims_per_device: int
    cells: Tuple[VideoCell, ...]
    optimizers: Dict[str, OptimizerRecipe]
    report_set: str = "moving_shapes_val"
    # the split that chooses the recipe (None: the grid has none)
    holdout_set: Optional[str] = None
    # overrides every cell of the grid takes first (the evaluation's splits and sizes)
    extra_overrides: Tuple[str, ...] = ()
    # True: the CSV also has the run's seconds by stage (VIDEO_STAGE_CSV_FIELDS)
    stage_columns: bool = False

    def recipe(self, optimizer: str) -> OptimizerRecipe:
        if optimizer not in self.optimizers:
            raise ValueError(f"unknown optimizer {optimizer!r}; one of {sorted(self.optimizers)}")
        return self.optimizers[optimizer]


def _video_cells() -> List[VideoCell]:
    """In the order two study processes take them: the baseline and the large batch first
    (the README's headline), then PMD-LAMB, the second seeds, the batch curve's other
    points and multigrid."""
    return [
        VideoCell("sgd", 16),
        VideoCell("sgd", 256),
        VideoCell("pmd_lamb", 256),
        VideoCell("sgd", 16, seed=1),
        VideoCell("sgd", 256, seed=1),
        VideoCell("pmd_lamb", 256, seed=1),
        VideoCell("sgd", 1024),
        VideoCell("pmd_lamb", 1024),
        VideoCell("sgd", 64),
        VideoCell("sgd", 256, multigrid=True),
        # the single-frame control: TSN at the baseline's recipe
        VideoCell("sgd", 16, backbone="TSNResNet"),
    ]


def _tsm4k_cells() -> List[VideoCell]:
    """The grid that can resolve one point, in the order two study processes take them:
    the batch-16 baseline's three seeds beside the batch-256 recipes' one-axis rows (one
    seed, the held-out split choosing): the epochs (1.4x, 2x), the schedule
    (warm-up-stable-decay), the warm-up (the paper's 5% of the run, 1.5 epochs, and 10)."""
    rows = []
    for axis in (dict(epochs_factor=1.4), dict(epochs_factor=2.0), dict(lr_schedule="wsd"),
                 dict(warmup_epochs=1.5), dict(warmup_epochs=10.0)):  # fmt: skip
        rows += [VideoCell("pmd_lamb", 256, **axis), VideoCell("sgd", 256, **axis)]
    return [
        VideoCell("sgd", 16),
        VideoCell("pmd_lamb", 256),
        VideoCell("sgd", 16, seed=1),
        VideoCell("sgd", 256),
        VideoCell("sgd", 16, seed=2),
        *rows,
        # multigrid whose coarsest long-cycle shape is 25% of N (base batch 128: 8x the clips,
        # 1024 a step; its short cycle's smallest crop 2048), against its own row without
        # multigrid at equal epochs (the step schedule multigrid needs on both), two seeds
        # each: top-1 and the CPU wall-clock
        VideoCell("sgd", 128, multigrid=True),
        VideoCell("sgd", 128, lr_schedule="step"),
        VideoCell("sgd", 128, multigrid=True, seed=1),
        VideoCell("sgd", 128, lr_schedule="step", seed=1),
        # seeds of the row the held-out split chose among the one-axis rows so far (SGD, a
        # 10-epoch warm-up), for the check's three seeds at 1.0x
        VideoCell("sgd", 256, warmup_epochs=10.0, seed=1),
        VideoCell("sgd", 256, warmup_epochs=10.0, seed=2),
        # the chosen warm-up at 1.4x the epochs, and at half the linear rule's LR (0.16:
        # does the rule overshoot at 16x the reference batch?)
        VideoCell("sgd", 256, epochs_factor=1.4, warmup_epochs=10.0),
        VideoCell("sgd", 256, warmup_epochs=10.0, lr_factor=0.5),
        # PMD-LAMB ends every batch-256 row with a higher training loss than SGD: twice its
        # square-root rule's LR (0.04)
        VideoCell("pmd_lamb", 256, lr_factor=2.0),
        # batch 1024 (25% of N per step) with SGD's warm-up at 2x the epochs, two seeds
        VideoCell("sgd", 1024, epochs_factor=2.0, warmup_epochs=10.0),
        VideoCell("sgd", 1024, epochs_factor=2.0, warmup_epochs=10.0, seed=1),
        # multigrid with the LR held at the base shape's (0.16 at every shape): with the
        # linear rule its coarsest stage is SGD at 1024 clips and LR 1.28, the setting that
        # did not train in the first grid
        VideoCell("sgd", 128, multigrid=True, multigrid_scale_lr=False),
        VideoCell("sgd", 128, multigrid=True, multigrid_scale_lr=False, seed=1),
        # base batch 64: more steps (the coarsest long-cycle shape 512 clips, its short
        # cycle's smallest crop 1024 = 25% of N), LR held and the linear rule's, against the
        # step schedule at batch 64
        VideoCell("sgd", 64, multigrid=True, multigrid_scale_lr=False),
        VideoCell("sgd", 64, lr_schedule="step"),
        VideoCell("sgd", 64, multigrid=True),
        VideoCell("sgd", 64, multigrid=True, multigrid_scale_lr=False, seed=1),
        VideoCell("sgd", 64, lr_schedule="step", seed=1),
        # the short cycle alone (no long cycle: every step has the base shape's frames and
        # the LR of the base step schedule; crops alternate S/2, S/sqrt(2), S with 4x, 2x
        # and 1x the clips): both long-cycle rows at LR held end training near loss 1.3,
        # so is the long cycle's coarse start the cause? Against the same step-schedule
        # rows, two seeds
        VideoCell("sgd", 128, multigrid=True, multigrid_long_cycle=False),
        VideoCell("sgd", 128, multigrid=True, multigrid_long_cycle=False, seed=1),
        VideoCell("sgd", 64, multigrid=True, multigrid_long_cycle=False),
        # the short cycle at twice the epochs (about the base schedule's steps at 1.0x). The
        # multigrid rows run before multigrid always recomputed BN at the base shape were
        # tested with BN statistics mixed over their shapes: tsm4k_study_before_bn_fix.csv
        # keeps them apart, and the rows of these names are the runs since
        VideoCell("sgd", 128, multigrid=True, multigrid_long_cycle=False, epochs_factor=2.0),
        # the 5-epoch warm-up's seeds: held-out, the 10-epoch warm-up (n=3) leads the 5-epoch
        # one (n=1) by less than the baseline's SD; three seeds each resolve which one the
        # held-out split chooses
        VideoCell("sgd", 256, seed=1),
        VideoCell("sgd", 256, seed=2),
        # PMD-LAMB at twice its square-root rule's LR is the best batch-256 row on the
        # held-out split at 1.0x (one seed): its seeds, and the LR axis one step further
        VideoCell("pmd_lamb", 256, lr_factor=2.0, seed=1),
        VideoCell("pmd_lamb", 256, lr_factor=2.0, seed=2),
        VideoCell("pmd_lamb", 256, lr_factor=4.0),
        # the short cycle at 2x the epochs against the step schedule at 2x (equal epochs),
        # and its second seeds; rerun of the multigrid rows with BN recomputed at the base
        # shape (the rows before that are in tsm4k_study_before_bn_fix.csv)
        VideoCell("sgd", 128, epochs_factor=2.0, lr_schedule="step"),
        VideoCell("sgd", 128, multigrid=True, multigrid_long_cycle=False, epochs_factor=2.0, seed=1),
        VideoCell("sgd", 128, epochs_factor=2.0, lr_schedule="step", seed=1),
        # batch 1024 (25% of N per step) at the held-out split's recipe (PMD-LAMB, twice the
        # square-root rule's LR) and 2x the epochs, two seeds
        VideoCell("pmd_lamb", 1024, epochs_factor=2.0, lr_factor=2.0),
        VideoCell("pmd_lamb", 1024, epochs_factor=2.0, lr_factor=2.0, seed=1),
        # its two seeds are 2.3 apart: the third seed the check takes
        VideoCell("pmd_lamb", 1024, epochs_factor=2.0, lr_factor=2.0, seed=2),
        # the batch-16 baseline's LR, swept as the large batch's was (x0.5, x2 of 0.01): the
        # same tuning on both sides of the check
        VideoCell("sgd", 16, lr_factor=0.5),
        VideoCell("sgd", 16, lr_factor=2.0),
        # both sides' LR sweeps one step past their best so far (x4 at batch 16; x0.5 of
        # PMD-LAMB's square-root rule), then seeds 1 and 2 of each candidate: the held-out
        # split's seed-0 choice on each side takes its three seeds (tsm4k_study_zen5.csv
        # holds the grid's rerun on one machine class)
        VideoCell("sgd", 16, lr_factor=4.0),
        VideoCell("pmd_lamb", 256, lr_factor=0.5),
        *[VideoCell("sgd", 16, lr_factor=f, seed=s) for f in (2.0, 4.0, 0.5) for s in (1, 2)],
        *[VideoCell("pmd_lamb", 256, lr_factor=f, seed=s) for f in (1.0, 4.0) for s in (1, 2)],
        # the chosen recipes' seeds 3 and 4 on each side: with three, the batch-16 side's
        # spread leaves the interval too wide for the goal's lower bound
        *[VideoCell(opt, batch, lr_factor=2.0, seed=s) for s in (3, 4) for opt, batch in (("sgd", 16), ("pmd_lamb", 256))],
    ]


def _mg_time_cells(batch: int = 128) -> List[VideoCell]:
    """Multigrid's time to accuracy at one base batch: the plain step schedule and the three
    multigrid schedules (long and short cycle, the long cycle alone, the short cycle alone),
    three seeds each, first at the base schedule's epochs, then at a second budget each
    (half the epochs for the plain schedule, twice for multigrid: the two points of a
    schedule's top-1 against its wall clock that bracket the plain schedule's top-1). In the
    order two study processes take them: every schedule's seed 0 before any seed 1.

    The long-cycle schedules hold the base shape's LR at every shape (``-lrheld``): with the
    linear rule (the paper's) the coarsest stage is SGD at 1024 clips a step (25% of N) and
    LR 1.28, and both of its seed-0 rows, kept at the grid's end, ended at chance (the loss
    at ln 8 from the first stage on)."""
    schedules = [({"lr_schedule": "step"}, 0.5), ({"multigrid": True, "multigrid_scale_lr": False}, 2.0),
                 ({"multigrid": True, "multigrid_short_cycle": False, "multigrid_scale_lr": False}, 2.0),
                 ({"multigrid": True, "multigrid_long_cycle": False}, 2.0)]  # fmt: skip
    cells = []
    for budget in (False, True):
        for seed in (None, 1, 2):
            for axis, factor in schedules:
                cells.append(VideoCell("sgd", batch, seed=seed, epochs_factor=factor if budget else 1.0, **axis))
    # the linear rule's long-cycle schedules, seed 0 at the base epochs: they did not train
    cells += [VideoCell("sgd", batch, multigrid=True),
              VideoCell("sgd", batch, multigrid=True, multigrid_short_cycle=False)]  # fmt: skip
    return cells


#: the long cycle's (time, space) factors that keep every frame: the paper's voxels per clip
#: at each stage (1/8, 1/4, 1/2, 1) from the crop alone
KEEP_FRAMES_FACTORS = ((1.0, 0.125**0.5), (1.0, 0.5), (1.0, 0.5**0.5), (1.0, 1.0))


def _mg_time16_cells() -> List[VideoCell]:
    """Multigrid's time to accuracy at base batch 16, the paper's regime: the coarsest
    long-cycle shape is 128 clips a step (3% of N, where the ``mg_time`` grid's base batch 128
    makes it 25%), so the linear rule's LR there (0.16) is the one batch 128 trains with, and
    the coarse stages keep hundreds of steps. The plain step schedule and the three multigrid
    schedules with the linear rule (the paper's), three seeds each at the base epochs (every
    schedule's seed 0 before any seed 1), then the plain schedule at half the epochs (the
    curve's second point below the reference)."""
    schedules = [{"lr_schedule": "step"}, {"multigrid": True},
                 {"multigrid": True, "multigrid_short_cycle": False},
                 {"multigrid": True, "multigrid_long_cycle": False}]  # fmt: skip
    cells = [VideoCell("sgd", 16, seed=seed, **axis) for seed in (None, 1, 2) for axis in schedules]
    cells += [VideoCell("sgd", 16, seed=seed, epochs_factor=0.5, lr_schedule="step") for seed in (None, 1, 2)]
    # the long-cycle rows at base batch 128 end their first stage (a quarter of the frames) at
    # chance, and the task's label is in the motion: the long cycle alone with every frame
    # kept, its crops shrunk to the same voxels, three seeds
    cells += [VideoCell("sgd", 16, seed=seed, multigrid=True, multigrid_short_cycle=False, multigrid_keep_frames=True)
              for seed in (None, 1, 2)]  # fmt: skip
    # the held-out split's choice at the base epochs (the long cycle alone, about 2x as fast
    # and several points below) at twice the epochs, three seeds: its curve's second point,
    # which brackets the plain schedule's top-1 or shows that it does not reach it
    cells += [VideoCell("sgd", 16, seed=seed, epochs_factor=2.0, multigrid=True, multigrid_short_cycle=False)
              for seed in (None, 1, 2)]  # fmt: skip
    return cells


def _mg_time64_cells() -> List[VideoCell]:
    """The ``mg_time16`` design on the 64-px, 16-frame task: base batch 16, the linear rule
    (the paper's), the long cycle's coarsest shape 128 clips of 4 frames at 45 px (6% of its
    2048 videos). The plain step schedule and the long cycle alone (the 32-px grid's choice)
    first, three seeds each, then seed 0 of the long and short cycle together and of the
    short cycle alone, then each curve's second point (the plain schedule at half the
    epochs, the long cycle at twice them), three seeds, then the other two schedules' seeds
    1 and 2."""
    plain, long_ = {"lr_schedule": "step"}, {"multigrid": True, "multigrid_short_cycle": False}
    both, short = {"multigrid": True}, {"multigrid": True, "multigrid_long_cycle": False}
    cells = [VideoCell("sgd", 16, seed=seed, **axis) for seed in (None, 1, 2) for axis in (plain, long_)]
    cells += [VideoCell("sgd", 16, **both), VideoCell("sgd", 16, **short)]
    cells += [VideoCell("sgd", 16, seed=seed, epochs_factor=0.5, **plain) for seed in (None, 1, 2)]
    cells += [VideoCell("sgd", 16, seed=seed, epochs_factor=2.0, **long_) for seed in (None, 1, 2)]
    cells += [VideoCell("sgd", 16, seed=seed, **axis) for seed in (1, 2) for axis in (both, short)]
    return cells


#: mg_time64's evaluation: the tsm4k splits (4096 reported, 2048 held-out videos) at 2 clips x
#: 1 crop each, not 10 x 3: at 64 px and 16 frames a clip costs about 4.5x the 32-px one's,
#: and 30 views would make the evaluation take longer than the training
MG_TIME64_TEST_VIEWS = ("INPUT.VIDEO.TEST_NUM_CLIPS", "2", "INPUT.VIDEO.TEST_NUM_CROPS", "1")

#: tsm4k's evaluation: 4096 reported videos (the first 1024 are tsm's), 2048 held-out
#: videos of another seed to choose on; both 10 clips x 3 crops
TSM4K_NUM_VAL = 4096
TSM4K_NUM_HOLDOUT = 2048
HOLDOUT_SET = "moving_shapes_holdout_val"

#: "tsm": the first grid (1024 validation videos that chose and reported);
#: "tsm4k": 4096 reported and 2048 held-out validation videos
#: "mg_time": multigrid's time to accuracy on tsm4k's task and evaluation; "mg_time16": the
#: mg_time grid's task at base batch 16; "mg_time64": mg_time16's design on the 64-px,
#: 16-frame task (2048 training videos, 15 epochs: a base step there costs about 4.5x the
#: 32-px one for 8x its voxels), evaluated on 2 views a video
VIDEO_GRID_NAMES = ("tsm", "tsm4k", "mg_time", "mg_time64", "mg_time16")
MG_TIME64_CONFIG = "projects/video/configs/study/Base-Study-TSM-R18w16-16f-64px.yaml"


def build_video_grid(name: str = "tsm") -> VideoGrid:
    if name not in VIDEO_GRID_NAMES:
        raise ValueError(f"--grid must be one of {VIDEO_GRID_NAMES}, got {name!r}")
    grid = VideoGrid(
        config="projects/video/configs/study/Base-Study-TSM-R18w16-8f-32px.yaml",
        num_train=NUM_TRAIN,
        epochs=EPOCHS,
        warmup_epochs=WARMUP_EPOCHS,
        ims_per_device=16,
        cells=tuple(_video_cells()),
        optimizers=VIDEO_OPTIMIZERS,
    )
    if name in ("tsm4k", "mg_time", "mg_time64", "mg_time16"):
        cells = {"tsm4k": _tsm4k_cells, "mg_time16": _mg_time16_cells,
                 "mg_time64": _mg_time64_cells}.get(name, _mg_time_cells)()  # fmt: skip
        grid = replace(
            grid,
            cells=tuple(cells),
            holdout_set=HOLDOUT_SET,
            extra_overrides=(
                "DATASETS.TEST", f"('{HOLDOUT_SET}', 'moving_shapes_val')",
                "DATASETS.MOVING_SHAPES.NUM_VAL", str(TSM4K_NUM_VAL),
                "DATASETS.MOVING_SHAPES.HOLDOUT_NUM_VAL", str(TSM4K_NUM_HOLDOUT),
            ),
        )  # fmt: skip
    if name in ("mg_time", "mg_time16"):
        grid = replace(grid, stage_columns=True)
    if name == "mg_time64":
        grid = replace(grid, config=MG_TIME64_CONFIG, num_train=2048, epochs=15, stage_columns=True,
                       extra_overrides=grid.extra_overrides + MG_TIME64_TEST_VIEWS)
    return grid


@dataclass
class VideoPlan:
    cell: VideoCell
    iterations: int
    warmup: int
    lr: float
    pmd_period: Optional[int]
    steps: Optional[Tuple[int, int]]
    overrides: List[str]

    @property
    def per_device(self) -> int:
        return int(self.overrides[self.overrides.index("SOLVER.IMS_PER_DEVICE") + 1])


def plan_video_cell(grid: VideoGrid, cell: VideoCell, output_dir: str, world: int = 1) -> VideoPlan:
    """What ``cell`` runs: its steps, warm-up, LR and the config overrides that say so (the
    numbers the detection study derives alike: :func:`largedet_study.grid.cell_numbers`)."""
    numbers = cell_numbers(grid, cell, world, warmup_epochs=None, schedules=VIDEO_LR_SCHEDULES,
                           min_warmup=1, step_drops=cell.multigrid or cell.lr_schedule == "step")  # fmt: skip
    iterations, warmup, period, steps = numbers.iterations, numbers.warmup, numbers.pmd_period, numbers.steps
    overrides = list(grid.extra_overrides) + recipe_overrides(
        numbers.recipe, cell.batch, numbers.per_device, cell.lr_factor, None, iterations, warmup, output_dir
    )
    if cell.lr_schedule != "cosine" and not cell.multigrid:
        overrides += ["SOLVER.LR_SCHEDULER_NAME", VIDEO_LR_SCHEDULES[cell.lr_schedule]]
        if steps:
            overrides += ["SOLVER.STEPS", f"({steps[0]}, {steps[1]})"]
    if cell.multigrid:
        overrides += ["SOLVER.LR_SCHEDULER_NAME", "WarmupMultiStepLR",
                      "SOLVER.STEPS", f"({steps[0]}, {steps[1]})", *MULTIGRID_OVERRIDES]  # fmt: skip
        if not cell.multigrid_scale_lr:
            overrides += ["MULTIGRID.SCALE_LR", "False"]
        if not cell.multigrid_long_cycle:
            overrides += ["MULTIGRID.LONG_CYCLE", "False"]
        if not cell.multigrid_short_cycle:
            overrides += ["MULTIGRID.SHORT_CYCLE", "False"]
        if cell.multigrid_keep_frames:
            overrides += ["MULTIGRID.LONG_CYCLE_FACTORS", str([list(f) for f in KEEP_FRAMES_FACTORS])]
        # the long cycle multiplies the clips per step, so the run has fewer steps than the
        # base schedule: its warm-up is the steps of its own first 5 epochs
        iterations, warmup = _multigrid_steps(grid, overrides, world)
        overrides[overrides.index("SOLVER.WARMUP_ITERS") + 1] = str(warmup)
    if cell.backbone != "TSMResNet":
        overrides += ["MODEL.VIDEO.BACKBONE", cell.backbone]
    if period is not None:
        overrides += ["SOLVER.PMD.PERIOD", str(period)]
    if cell.seed is not None:
        overrides += ["SEED", str(cell.seed)]
    lr = cell_run_plan(grid.config, overrides, world, grid.num_train, _video_config).lr.lr
    return VideoPlan(cell, iterations, warmup, lr, period, steps, overrides)


def _video_config():
    from detectron2.config import get_cfg

    from largedet_video.config import add_video_config

    cfg = get_cfg()
    add_video_config(cfg)
    return cfg


def _multigrid_steps(grid: VideoGrid, overrides: List[str], world: int) -> Tuple[int, int]:
    """(optimizer steps, steps of the first ``grid.warmup_epochs`` epochs) of the multigrid
    plan the overrides make on ``grid``'s config."""
    from largedet_video.multigrid import build_multigrid_plan

    plan = build_multigrid_plan(cell_config(grid.config, overrides, _video_config), grid.num_train, world)
    return plan.max_iter, plan.first_step_of_epoch(math.ceil(grid.warmup_epochs))


VIDEO_CSV_FIELDS = [
    "cell", "optimizer", "batch", "batch_fraction", "ims_per_device", "accumulation",
    "lr_rule", "lr", "warmup_iters", "iterations", "epochs", "pmd_period", "multigrid",
    "seed", "top1", "diverged", "final_loss", "wall_clock_s", "clips_per_s", "device",
    "threads", "output_dir",
]  # fmt: skip
#: a grid with a held-out split also writes its top-1, the schedule, both splits' sizes and
#: ``train_s``: the run's wall clock less its evaluation, over all its invocations (the
#: trainer's run summary; ``wall_clock_s`` is the whole process, evaluation included)
VIDEO_HOLDOUT_CSV_FIELDS = VIDEO_CSV_FIELDS + [
    "lr_schedule", "warmup_epochs", "holdout_top1", "val_videos", "holdout_videos", "train_s",
]  # fmt: skip
#: a grid with stage columns also writes the training steps', their data wait's and precise
#: BN's seconds, summed over the run's invocations (its stage_times.json), the first
#: invocation's start (UTC) and the range of the machine-speed probes around its invocations
#: (largedet_study.speed_probe)
VIDEO_STAGE_CSV_FIELDS = VIDEO_HOLDOUT_CSV_FIELDS + [
    "step_s", "data_s", "precise_bn_s", "started_utc", "probe_ms_min", "probe_ms_max",
]  # fmt: skip


def final_top1(metrics: Sequence[dict], test_set: str, key: str = "top1") -> str:
    """The last top-1 (percent, two decimals; a non-finite one as "0.00") of ``test_set`` in a
    run's metrics.json rows (:func:`~largedet_video.evaluation.last_classification_metric`);
    "" where there is none. ``key="num_videos"``: the number of videos it was computed on,
    as an integer."""
    v = last_classification_metric(metrics, test_set, key)
    if v is None:
        return ""
    if key == "num_videos":
        return str(int(v))
    return f"{v:.2f}" if math.isfinite(v) else "0.00"
