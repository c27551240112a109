"""The large-batch detection recipe as config keys for one's own batch, dataset and devices.

The recipe is the one ``configs/r50_fpn_bs1056.yaml`` carries (the regime grid's
``pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01``, docs/recipes.md): PMD-LAMB with weight decay 0.01,
the square-root scaling rule from LR 0.0008 at batch 16, a warm-up of 20% of the 1x
schedule's steps, the peak LR until 80% of the run then linear to 0 (warm-up-stable-decay),
a PMD period of a quarter of the run, and 1.4x the epochs of Detectron2's 1x schedule
(90,000 steps of 16 images on COCO's 118,287 training images). :func:`detection_recipe`
turns "my batch, my number of images, my GPUs" into those keys; pure arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

__all__ = [
    "COCO_TRAIN_IMAGES",
    "ONE_X_IMAGES",
    "Recipe",
    "RecipeError",
    "detection_recipe",
]

#: COCO 2017's training images, on which Detectron2's 1x schedule is defined
COCO_TRAIN_IMAGES = 118287
#: images of Detectron2's 1x schedule on COCO: 90,000 steps x 16
ONE_X_IMAGES = 90000 * 16
#: the study grid whose recipe this is, its large batch and training images
#: (study/largedet_study/grid.py, ``regime``)
EVIDENCE_GRID = ("regime", 256, 24576)
#: the shares of the data per step at and above which every measured recipe cost AP
#: (the regime grid's 1024 of 24,576), docs/recipes.md
COSTLY_SHARE = 1024 / 24576

_REFERENCE = (16, 0.0008)  # SOLVER.LSR.REFERENCE_BATCH, REFERENCE_LR (square-root rule)
_WEIGHT_DECAY = 0.01
_DECAY_START = 0.8  # SOLVER.WSD.DECAY_START
_WARMUP_OF_ONE_X = 0.2  # warm-up steps: a share of the 1x schedule's steps
_PERIODS_PER_RUN = 4  # SOLVER.PMD.PERIOD: a quarter of the run
#: the budgets measured (x the 1x schedule's epochs) -> the regime grid's cell suffix
_MEASURED_EPOCHS = {1.0: "", 1.4: "-ep1.4x", 2.0: "-ep2x"}


class RecipeError(ValueError):
    """Numbers the recipe cannot use; the message names the flag and what would work."""


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


@dataclass(frozen=True)
class Recipe:
    """The recipe's numbers for one run: every count in optimizer steps of the full batch."""

    batch: int  # SOLVER.IMS_PER_BATCH, the global batch
    images: int  # training images
    gpus: int
    ims_per_device: int  # SOLVER.IMS_PER_DEVICE
    epochs_factor: float  # x the 1x schedule's epochs
    one_x_steps: int  # the 1x schedule's steps at this batch
    max_iter: int  # SOLVER.MAX_ITER
    warmup_iters: int  # SOLVER.WARMUP_ITERS
    pmd_period: int  # SOLVER.PMD.PERIOD

    @property
    def accumulation(self) -> int:
        """Micro-batches accumulated per optimizer step on each device."""
        return self.batch // (self.gpus * self.ims_per_device)

    @property
    def share(self) -> float:
        """The batch as a share of the training images."""
        return self.batch / self.images

    @property
    def peak_lr(self) -> float:
        """The square-root rule's LR at this batch."""
        return _REFERENCE[1] * math.sqrt(self.batch / _REFERENCE[0])

    def yaml_keys(self) -> List[Tuple[str, object]]:
        """``(key, value)`` of the yacs config, in the order a config file lists them."""
        return [
            ("SOLVER.OPTIMIZER", "PMD_LAMB"),
            ("SOLVER.IMS_PER_BATCH", self.batch),
            ("SOLVER.IMS_PER_DEVICE", self.ims_per_device),
            ("SOLVER.LSR.ENABLED", True),
            ("SOLVER.LSR.RULE", "sqrt"),
            ("SOLVER.LSR.REFERENCE_BATCH", _REFERENCE[0]),
            ("SOLVER.LSR.REFERENCE_LR", _REFERENCE[1]),
            ("SOLVER.PMD.PERIOD", self.pmd_period),
            ("SOLVER.WEIGHT_DECAY", _WEIGHT_DECAY),
            ("SOLVER.WARMUP_ITERS", self.warmup_iters),
            ("SOLVER.LR_SCHEDULER_NAME", "WarmupStableDecayLR"),
            ("SOLVER.WSD.DECAY_START", _DECAY_START),
            ("SOLVER.STEPS", ()),
            ("SOLVER.MAX_ITER", self.max_iter),
        ]

    def lazy_overrides(self) -> List[str]:
        """``key=value`` overrides of a LazyConfig whose optimizer is ``L(PMDLAMB)``."""
        return [
            f"train.ims_per_batch={self.batch}",
            f"train.ims_per_device={self.ims_per_device}",
            "train.lsr.enabled=True",
            "train.lsr.rule=sqrt",
            f"train.lsr.reference_batch={_REFERENCE[0]}",
            f"train.lsr.reference_lr={_REFERENCE[1]}",
            f"optimizer.period={self.pmd_period}",
            f"optimizer.weight_decay={_WEIGHT_DECAY}",
            f"train.warmup.iters={self.warmup_iters}",
            f"train.max_iter={self.max_iter}",
        ]

    def evidence(self) -> str:
        """The study rows behind the recipe at this budget, or the nearest measured one."""
        grid, batch, images = EVIDENCE_GRID
        suffix = _MEASURED_EPOCHS.get(round(self.epochs_factor, 3))
        nearest = min(_MEASURED_EPOCHS, key=lambda f: abs(f - self.epochs_factor))
        cell = f"pmd_lamb-bs{batch}{_MEASURED_EPOCHS[nearest]}-lrwsd-wd0.01"
        budget = "" if suffix is not None else f" (not measured at {self.epochs_factor:g}x; nearest {nearest:g}x)"
        return (
            f"the {grid} grid's rows {cell} and {cell}-s1, -s2 (batch {batch} = "
            f"{100 * batch / images:.2f}% of {images:,} images per step, {nearest:g}x epochs){budget} "
            "in study/results/batch_scaling_regime.csv; docs/recipes.md reads them"
        )


def detection_recipe(
    batch: int, images: int, gpus: int, ims_per_device: int = 4, epochs_factor: float = 1.4
) -> Recipe:
    """The recipe's keys for a global batch ``batch`` on ``images`` training images and
    ``gpus`` devices of ``ims_per_device`` images each, trained ``epochs_factor`` x the 1x
    schedule's epochs. Raises :class:`RecipeError` for a batch that does not split into
    whole micro-batches, naming device counts and batches that do."""
    for flag, value in (("--batch", batch), ("--images", images), ("--gpus", gpus),
                        ("--ims-per-device", ims_per_device)):  # fmt: skip
        if not isinstance(value, int) or value < 1:
            raise RecipeError(f"{flag}: must be an integer >= 1, got {value!r}")
    if not epochs_factor > 0:
        raise RecipeError(f"--epochs: must be > 0, got {epochs_factor!r}")
    per_step = gpus * ims_per_device
    if batch % per_step:
        devices = [d for d in range(1, batch // ims_per_device + 1) if batch % (d * ims_per_device) == 0]
        lower, upper = batch // per_step * per_step, (batch // per_step + 1) * per_step
        raise RecipeError(
            f"--batch {batch} is not a whole multiple of --gpus {gpus} x --ims-per-device "
            f"{ims_per_device}; at {ims_per_device} images per GPU it splits over "
            f"{', '.join(map(str, devices))} GPUs; on {gpus} GPUs, batch "
            + (f"{lower} or {upper}" if lower else f"{upper}")
        )
    one_x = _round(ONE_X_IMAGES * images / COCO_TRAIN_IMAGES / batch)
    max_iter = max(_round(epochs_factor * one_x), 1)
    return Recipe(
        batch=batch,
        images=images,
        gpus=gpus,
        ims_per_device=ims_per_device,
        epochs_factor=epochs_factor,
        one_x_steps=one_x,
        max_iter=max_iter,
        warmup_iters=_round(_WARMUP_OF_ONE_X * one_x),
        pmd_period=max(_round(max_iter / _PERIODS_PER_RUN), 1),
    )
