"""study/multigrid_profile.py --dry-run: each schedule is the study's
cell in miniature (its steps on the profile's videos and epochs, one batch per step unless
--per-device says otherwise)."""

import os
import shlex
import subprocess
import sys

STUDY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(STUDY, "multigrid_profile.py")


def _dry_run(*args):
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(("==", "  "))]


def test_plans_of_the_profile():
    lines = _dry_run("--schedules", "plain", "short", "long")
    heads, overrides = lines[0::2], [shlex.split(line) for line in lines[1::2]]
    # 12 epochs of 256 videos at 16 clips a step: 192 plain steps
    assert heads[0] == "== plain: sgd-bs16-lrstep, 192 steps on 256 videos x 12 epochs (32px)"
    assert heads[1].startswith("== short: sgd-bs16-multigrid-short, ")
    assert heads[2].startswith("== long: sgd-bs16-multigrid-long, ")
    for o in overrides:
        pairs = dict(zip(o[0::2], o[1::2]))
        assert pairs["SOLVER.IMS_PER_DEVICE"] == pairs["SOLVER.IMS_PER_BATCH"] == "16"
        assert pairs["DATASETS.MOVING_SHAPES.NUM_TRAIN"] == "256" and pairs["DATASETS.TEST"] == "('moving_shapes_val',)"
    assert "MULTIGRID.LONG_CYCLE" not in overrides[0]
    short, long_ = (dict(zip(o[0::2], o[1::2])) for o in overrides[1:])
    assert (short["MULTIGRID.LONG_CYCLE"], long_["MULTIGRID.SHORT_CYCLE"]) == ("False", "False")


def test_the_studys_accumulation_and_the_64px_task():
    (head, line), = zip(*[iter(_dry_run("--schedules", "plain", "--batch", "128", "--per-device", "16",
                                        "--task", "64px"))] * 2)  # fmt: skip
    words = shlex.split(line)
    pairs = dict(zip(words[0::2], words[1::2]))
    # 12 epochs of 256 videos at 128: 24 steps of 8 batches of 16
    assert head == "== plain: sgd-bs128-lrstep, 24 steps on 256 videos x 12 epochs (64px)"
    assert (pairs["SOLVER.IMS_PER_BATCH"], pairs["SOLVER.IMS_PER_DEVICE"]) == ("128", "16")
