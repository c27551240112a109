"""Batch arithmetic: global batch = world size x per-device batch x accumulation steps,
and the error for a global batch that does not split, raised before any worker starts."""

import os
import subprocess
import sys

import pytest

import largedet  # noqa: F401
from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.engine import largedet_argument_parser, planned_world_size, setup_cfg
from largedet.solver.batch import BatchArithmeticError, BatchPlan, batch_plan

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SHAPES_CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


def solver_cfg(ims_per_batch, ims_per_device):
    cfg = add_largedet_config(get_cfg())
    cfg.SOLVER.IMS_PER_BATCH = ims_per_batch
    cfg.SOLVER.IMS_PER_DEVICE = ims_per_device
    return cfg


@pytest.mark.parametrize(
    "ims_per_batch, ims_per_device, world_size, expected",
    [
        (16, 0, 8, BatchPlan(16, 8, 2, 1)),  # Detectron2's meaning: IMS_PER_BATCH / world size
        (1056, 4, 8, BatchPlan(1056, 8, 4, 33)),
        (1056, 1, 2, BatchPlan(1056, 2, 1, 528)),
        (1056, 8, 132, BatchPlan(1056, 132, 8, 1)),
        (64, 8, 1, BatchPlan(64, 1, 8, 8)),
    ],
)
def test_plans(ims_per_batch, ims_per_device, world_size, expected):
    plan = batch_plan(solver_cfg(ims_per_batch, ims_per_device), world_size)
    assert plan == expected
    assert plan.global_batch == plan.world_size * plan.per_device * plan.accumulation
    assert plan.per_device_step == plan.per_device * plan.accumulation


@pytest.mark.parametrize(
    "ims_per_batch, ims_per_device, world_size, numbers",
    [
        (1056, 4, 160, ["1056", "160", "4"]),
        (16, 3, 2, ["16", "2", "3"]),
        (8, 0, 3, ["8", "3"]),
    ],
)
def test_errors_name_the_numbers(ims_per_batch, ims_per_device, world_size, numbers):
    with pytest.raises(BatchArithmeticError) as error:
        batch_plan(solver_cfg(ims_per_batch, ims_per_device), world_size)
    message = str(error.value)
    assert "SOLVER.IMS_PER_BATCH" in message
    for number in numbers:
        assert f" {number}" in message


def check_batch_arithmetic(args):
    # the plan of the run the command line describes, before any worker starts
    return batch_plan(setup_cfg(args, log=False), planned_world_size(args))


def test_check_from_the_command_line_arguments():
    parser = largedet_argument_parser()
    args = parser.parse_args(
        ["--config", SHAPES_CONFIG, "--num-gpus", "2", "SOLVER.IMS_PER_DEVICE", "2"]
    )
    assert check_batch_arithmetic(args) == BatchPlan(8, 2, 2, 2)
    args = parser.parse_args(["--config", SHAPES_CONFIG, "--num-gpus", "3", "--num-machines", "2"])
    with pytest.raises(
        BatchArithmeticError, match="SOLVER.IMS_PER_BATCH 8 is not divisible by the world size 6"
    ):
        check_batch_arithmetic(args)


def test_train_net_errors_before_spawning_workers():
    cmd = [
        sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", SHAPES_CONFIG,
        "--num-gpus", "3", "SOLVER.IMS_PER_DEVICE", "2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # argparse's error exit, in the launching process
    assert (
        "error: SOLVER.IMS_PER_BATCH 8 is not a whole multiple of world size 3 x SOLVER.IMS_PER_DEVICE 2 = 6"
        in proc.stderr
    )
    # nothing was spawned: no worker traceback, no training log
    assert (
        "ProcessRaisedException" not in proc.stderr
        and "Starting training" not in proc.stdout + proc.stderr
    )
