"""The batch arithmetic of a run: global batch, devices, micro-batch, accumulation steps."""

from __future__ import annotations

from dataclasses import dataclass

from detectron2.config import CfgNode

__all__ = ["BatchArithmeticError", "BatchPlan", "batch_plan"]


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
        return BatchPlan(total, world_size, total // world_size, 1)
    if total % (world_size * per_device):
        raise BatchArithmeticError(
            f"SOLVER.IMS_PER_BATCH {total} is not a whole multiple of world size {world_size} x "
            f"SOLVER.IMS_PER_DEVICE {per_device} = {world_size * per_device}: the global batch "
            f"cannot be split into whole micro-batches"
        )
    return BatchPlan(total, world_size, per_device, total // (world_size * per_device))
