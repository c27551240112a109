"""The batch arithmetic of a run: global batch, devices, micro-batch, accumulation steps,
and the batch ramp (a smaller global batch early in training, through K alone)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from detectron2.config import CfgNode

__all__ = [
    "BatchArithmeticError",
    "BatchPlan",
    "BatchSchedule",
    "RampStage",
    "batch_plan",
    "batch_schedule",
    "check_agvm_estimates",
    "check_batch_ramp",
    "per_device_batch",
]


class BatchArithmeticError(ValueError):
    """The global batch does not split into whole micro-batches on the devices."""


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's images are spread over devices and micro-batches.

    ``global_batch = world_size * per_device * accumulation``: each device runs
    ``accumulation`` forward/backward passes of ``per_device`` images, gradients are
    summed over them (each loss scaled by ``1 / accumulation``) and averaged over devices.
    """

    global_batch: int  # SOLVER.IMS_PER_BATCH: images per optimizer step, all devices
    world_size: int  # processes (devices)
    per_device: int  # images in one forward pass of one device (the micro-batch)
    accumulation: int  # micro-batches per device per optimizer step (K)

    @property
    def per_device_step(self) -> int:
        """Images one device processes per optimizer step."""
        return self.per_device * self.accumulation

    def accumulation_on(self, world_size: int, per_device: int) -> int:
        """K of this global batch on ``world_size`` devices of ``per_device`` images a pass
        (another layout of the same run: a checkpoint's)."""
        return self.global_batch // (world_size * per_device)

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch} = {self.world_size} device(s) x {self.per_device} "
            f"image(s) per pass x {self.accumulation} accumulation step(s)"
        )


def batch_plan(cfg: CfgNode, world_size: int) -> BatchPlan:
    """The :class:`BatchPlan` of ``cfg.SOLVER`` on ``world_size`` devices.

    ``SOLVER.IMS_PER_DEVICE`` 0 means ``IMS_PER_BATCH / world_size`` (one micro-batch per
    step). Raises :class:`BatchArithmeticError`, naming the three numbers, when
    ``IMS_PER_BATCH`` is not a whole multiple of ``world_size x IMS_PER_DEVICE``.
    """
    total, per_device = cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.IMS_PER_DEVICE
    if total < 1 or per_device < 0 or world_size < 1:
        raise BatchArithmeticError(
            f"SOLVER.IMS_PER_BATCH must be >= 1 and SOLVER.IMS_PER_DEVICE >= 0 on >= 1 device(s); "
            f"got {total}, {per_device} and world size {world_size}"
        )
    if per_device == 0:
        if total % world_size:
            raise BatchArithmeticError(
                f"SOLVER.IMS_PER_BATCH {total} is not divisible by the world size {world_size} "
                f"(SOLVER.IMS_PER_DEVICE 0: IMS_PER_BATCH / world size images per device); "
                f"set SOLVER.IMS_PER_DEVICE or change the number of devices"
            )
        plan = BatchPlan(total, world_size, total // world_size, 1)
        check_batch_ramp(cfg, plan)
        return plan
    if total % (world_size * per_device):
        raise BatchArithmeticError(
            f"SOLVER.IMS_PER_BATCH {total} is not a whole multiple of world size {world_size} x "
            f"SOLVER.IMS_PER_DEVICE {per_device} = {world_size * per_device}: the global batch "
            f"cannot be split into whole micro-batches"
        )
    plan = BatchPlan(total, world_size, per_device, total // (world_size * per_device))
    check_batch_ramp(cfg, plan)
    return plan


def per_device_batch(most: int, global_batch: int, world_size: int) -> int:
    """The images one device holds per pass: at most ``most``, fewer where the global batch
    is smaller than that on every device (K accumulates the rest)."""
    return min(most, global_batch // world_size)


def check_batch_ramp(cfg: CfgNode, plan: BatchPlan) -> None:
    """Raise :class:`BatchArithmeticError` (one line naming the key) when
    ``SOLVER.BATCH_RAMP`` cannot run with ``plan``'s world size and micro-batch: a ramp
    batch that is not a whole multiple of world size x ``IMS_PER_DEVICE``, not below
    ``IMS_PER_BATCH``, or epochs that do not increase from above 0."""
    ramp = cfg.SOLVER.BATCH_RAMP
    batches, epochs = tuple(ramp.BATCHES), tuple(ramp.EPOCHS)
    if not batches and not epochs:
        return
    if len(batches) != len(epochs):
        raise BatchArithmeticError(
            f"SOLVER.BATCH_RAMP.BATCHES {batches} and SOLVER.BATCH_RAMP.EPOCHS {epochs} must "
            "have one entry per stage"
        )
    if cfg.SOLVER.IMS_PER_DEVICE == 0:
        raise BatchArithmeticError(
            "SOLVER.BATCH_RAMP needs SOLVER.IMS_PER_DEVICE > 0: the ramp changes the global "
            "batch through the accumulation steps K, with the images per device fixed"
        )
    unit = plan.world_size * plan.per_device
    for b in batches:
        if not isinstance(b, int) or b < unit or b % unit or b >= plan.global_batch:
            raise BatchArithmeticError(
                f"SOLVER.BATCH_RAMP.BATCHES: {b!r} is not a whole multiple of world size "
                f"{plan.world_size} x SOLVER.IMS_PER_DEVICE {plan.per_device} = {unit} below "
                f"SOLVER.IMS_PER_BATCH {plan.global_batch}"
            )
    if not all(e > 0 for e in epochs) or any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise BatchArithmeticError(
            f"SOLVER.BATCH_RAMP.EPOCHS {epochs} must be numbers > 0 in increasing order"
        )


@dataclass(frozen=True)
class RampStage:
    """Consecutive optimizer steps at one global batch."""

    batch: int  # global batch of each step
    accumulation: int  # K: micro-batches per device per step
    first_step: int  # 0-based iteration of the stage's first step
    steps: int
    first_image: int  # images of the global stream trained on before the stage


@dataclass(frozen=True)
class BatchSchedule:
    """The global batch of every optimizer step of a run, in stages; the last stage is
    the run's ``SOLVER.IMS_PER_BATCH``. Without a ramp, one stage.

    The run is ``total_images`` images long (``SOLVER.MAX_ITER x IMS_PER_BATCH``);
    schedules that a run defines in steps of the full batch (warm-up, LR steps, PMD's
    period) are read as images (steps x ``IMS_PER_BATCH``) and followed on the image
    clock :meth:`images_before`."""

    stages: Tuple[RampStage, ...]
    total_images: int

    @property
    def full_batch(self) -> int:
        return self.stages[-1].batch

    @property
    def total_steps(self) -> int:
        last = self.stages[-1]
        return last.first_step + last.steps

    @property
    def ramped(self) -> bool:
        return len(self.stages) > 1

    def stage_at(self, step: int) -> RampStage:
        starts = [s.first_step for s in self.stages]
        return self.stages[max(0, bisect.bisect_right(starts, step) - 1)]

    def batch_at(self, step: int) -> int:
        """The global batch of optimizer step ``step`` (0-based)."""
        return self.stage_at(step).batch

    def images_before(self, step: int) -> int:
        """Images of the global stream trained on before step ``step`` (0-based)."""
        stage = self.stage_at(step)
        return stage.first_image + (step - stage.first_step) * stage.batch

    def clock(self, step: int) -> float:
        """Step ``step``'s position in steps of the full batch: ``images_before / IMS_PER_BATCH``."""
        return self.images_before(step) / self.full_batch

    def describe(self, dataset_size: Optional[int] = None) -> str:
        def at(images: int) -> str:
            return f"{images / dataset_size:g} epochs" if dataset_size else f"{images} images"

        parts = [
            f"{s.batch} (K = {s.accumulation}) for steps {s.first_step}-{s.first_step + s.steps - 1} "
            f"(from {at(s.first_image)})"
            for s in self.stages
        ]
        end = self.images_before(self.total_steps)
        return (
            f"batch ramp: {'; '.join(parts)}: {self.total_steps} steps, {end} images; warm-up, "
            "LR steps and the PMD period are in images (steps x the full batch)"
        )


def batch_schedule(
    plan: BatchPlan,
    max_iter: int,
    ramp_batches: Sequence[int] = (),
    ramp_epochs: Sequence[float] = (),
    dataset_size: Optional[int] = None,
) -> BatchSchedule:
    """The :class:`BatchSchedule` of a run of ``max_iter`` steps at ``plan``'s global batch
    whose first stages run at ``ramp_batches``, each until ``ramp_epochs`` epochs of
    ``dataset_size`` images: a stage's steps go on until the images seen reach its end
    (its last step passes the end by less than one of its batches); the full batch then
    trains until ``max_iter x IMS_PER_BATCH`` images are reached the same way."""
    total = max_iter * plan.global_batch
    if ramp_batches and not dataset_size:
        raise ValueError("a batch ramp in epochs needs the training set's size")
    unit = plan.world_size * plan.per_device
    ends = [round(e * dataset_size) for e in ramp_epochs] if ramp_batches else []
    if ends and ends[-1] >= total:
        raise BatchArithmeticError(
            f"SOLVER.BATCH_RAMP.EPOCHS: the ramp ends at {ramp_epochs[-1]:g} epochs, not before "
            f"the run's end ({total / dataset_size:g} epochs = SOLVER.MAX_ITER x IMS_PER_BATCH)"
        )
    stages, step, image = [], 0, 0
    for batch, end in [*zip(ramp_batches, ends), (plan.global_batch, total)]:
        steps = max(0, math.ceil((end - image) / batch))
        if steps:
            stages.append(RampStage(batch, batch // unit, step, steps, image))
        step, image = step + steps, image + steps * batch
    return BatchSchedule(tuple(stages), total)


def check_agvm_estimates(accumulation_steps: int, world_size: int) -> None:
    """Raise ``ValueError`` when a step has no two independent gradient estimates for AGVM:
    one micro-batch per step (K = 1) on one process."""
    if accumulation_steps < 2 and world_size < 2:
        raise ValueError(
            "SOLVER.AGVM.ENABLED needs two independent gradient estimates per step: K >= 2 "
            "accumulated micro-batches (K = SOLVER.IMS_PER_BATCH / (world size x "
            "SOLVER.IMS_PER_DEVICE)) or two or more processes; got K = 1 on one process. Set "
            "SOLVER.IMS_PER_DEVICE to at most half of SOLVER.IMS_PER_BATCH, or "
            "SOLVER.AGVM.ENABLED False"
        )
