"""The mg_time grid's profile table (largedet_study.mg_time_profile) on a synthetic CSV and
archive: the seed-paired step count, seconds a step and compute per voxel against the plain
schedule, each number worked out by hand here."""

import json
import os

import pytest

from largedet_study import mg_time_profile as mp

AMX = "2-core Intel Xeon VM (AMX)"


def row(cell, iterations, step_s, pbn=0.0, data=10.0):
    return {"cell": cell, "train_s": str(step_s + pbn + 1), "holdout_top1": "80", "top1": "80", "diverged": "no",
            "device": AMX, "probe_ms_min": "20", "probe_ms_max": "21", "iterations": str(iterations),
            "step_s": str(step_s), "precise_bn_s": str(pbn), "data_s": str(data)}  # fmt: skip


def shapes(*entries):
    """A stage_times.json's invocation: ``(name, steps, compute ms per Mvoxel)`` per shape."""
    return {"steps": {name: {"steps": n, "compute_ms_per_mvoxel": v} for name, n, v in entries}}


def write(archive, cell, *invocations):
    os.makedirs(os.path.join(archive, cell))
    with open(os.path.join(archive, cell, "stage_times.json"), "w") as f:
        json.dump({"invocations": list(invocations)}, f)


def metrics(archive, cell, entries):
    """A metrics.json of ``(iteration, multigrid/stage, total_loss)`` rows (and one row
    without a loss, as an evaluation's)."""
    os.makedirs(os.path.join(archive, cell), exist_ok=True)
    with open(os.path.join(archive, cell, "metrics.json"), "w") as f:
        for it, stage, loss in entries:
            f.write(json.dumps({"iteration": it, "multigrid/stage": float(stage), "total_loss": loss}) + "\n")
        f.write(json.dumps({"iteration": entries[-1][0], "val/top1": 50.0}) + "\n")


def test_stage0_loss_is_the_last_loss_logged_in_stage_0(tmp_path):
    metrics(str(tmp_path), "c", [(19, 0, 2.2), (39, 0, 2.0), (59, 1, 1.5)])
    assert mp.stage0_loss("c", str(tmp_path)) == pytest.approx(2.0)
    assert mp.stage0_loss("missing", str(tmp_path)) is None


@pytest.fixture
def grid(tmp_path):
    archive = str(tmp_path)
    rows = [row("sgd-bs128-lrstep", 960, 720.0, data=90), row("sgd-bs128-lrstep-s1", 960, 960.0, data=110),
            row("sgd-bs128-multigrid-long-lrheld", 240, 360.0, pbn=40, data=60),
            row("sgd-bs128-multigrid-long-lrheld-s1", 320, 320.0, pbn=50, data=70)]  # fmt: skip
    write(archive, "sgd-bs128-lrstep", shapes(("8*16x8x32", 960, 700.0)))
    write(archive, "sgd-bs128-lrstep-s1", shapes(("8*16x8x32", 900, 800.0)), shapes(("8*16x8x32", 60, 950.0)))
    write(archive, "sgd-bs128-multigrid-long-lrheld", shapes(("8*128x2x23", 60, 1400.0), ("8*16x8x32", 180, 700.0)))
    # metrics.json: seed 0's stage 0 ends at loss 2.0, seed 1's at 1.0 (mean 1.5)
    metrics(archive, "sgd-bs128-multigrid-long-lrheld", [(19, 0, 2.2), (39, 0, 2.0), (59, 1, 1.5)])
    metrics(archive, "sgd-bs128-multigrid-long-lrheld-s1", [(19, 0, 1.0), (39, 1, 0.9)])
    # seed 1 has no archived stage_times.json: named, and left out of the voxel column
    return rows, archive


def test_compute_per_mvoxel_weights_shapes_and_invocations_by_steps():
    assert mp.compute_per_mvoxel([shapes(("a", 60, 1400.0), ("b", 180, 700.0))]) == pytest.approx(875.0)
    assert mp.compute_per_mvoxel([shapes(("a", 900, 800.0)), shapes(("a", 60, 950.0))]) == pytest.approx(809.375)
    assert mp.compute_per_mvoxel([shapes(("a", 0, 5.0))]) is None


def test_profile_table_is_seed_paired_against_the_plain_schedule(grid):
    rows, archive = grid
    lines = mp.mg_time_profile(rows, archive).splitlines()
    assert lines[0] == "Machine class Xeon-AMX; seed-paired means against the plain step schedule at 1x the epochs."
    by_label = {line.split(" | ")[0]: line for line in lines if line.startswith("| ") and "---" not in line}
    assert by_label["| plain step schedule, 1x the epochs"] == (
        "| plain step schedule, 1x the epochs | 2 | 960 | 1.00x | 1.00x | 1.00x | 0 | 100 | - |")
    # fewer steps: 960/240 = 4 and 960/320 = 3, mean 3.5; s a step: (360/240)/(720/960) = 2.0 and
    # (320/320)/(960/960) = 1.0, mean 1.5; compute per voxel: seed 0 only, 875 / 700 = 1.25;
    # precise BN (40 + 50) / 2 = 45, data (60 + 70) / 2 = 65
    assert by_label["| multigrid, long cycle alone, LR held, 1x the epochs"] == (
        "| multigrid, long cycle alone, LR held, 1x the epochs | 2 | 240, 320 | 3.50x | 1.50x | 1.25x | 45 | 65 | 1.50 |")
    assert lines[-1] == "Without an archived stage_times.json: `sgd-bs128-multigrid-long-lrheld-s1`."


def test_profile_without_a_reference():
    rows = [row("sgd-bs128-multigrid-long-lrheld", 240, 360.0)]
    assert mp.mg_time_profile(rows, "/nonexistent") == "(no plain-schedule row of this grid yet)"


def test_the_profile_block_is_registered():
    from largedet_study.report import BLOCKS

    assert "mg-time-profile" in BLOCKS


def test_a_row_without_stage_times_shows_dashes(grid):
    rows, archive = grid
    rows[2] = dict(rows[2], step_s="", precise_bn_s="", data_s="")  # seed 0: killed, stages unknown
    line = [l for l in mp.mg_time_profile(rows, archive).splitlines() if l.startswith("| multigrid, long")][0]
    # s a step from seed 1 alone: 1.0; precise BN and data from seed 1: 50 and 70
    assert line == "| multigrid, long cycle alone, LR held, 1x the epochs | 2 | 240, 320 | 3.50x | 1.00x | 1.25x | 50 | 70 | 1.50 |"
