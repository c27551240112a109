"""projects/video/benchmarks/multigrid_speed.py on the CPU with a tiny TSM: its figures agree
with themselves and with the schedule they come from."""

import json
import os
import subprocess
import sys

VIDEO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(VIDEO_ROOT, "benchmarks", "multigrid_speed.py")
TINY = ["--device", "cpu", "--num-samples", "240000", "--steps", "1", "--warmup", "1"]
TINY += ["--rounds", "2", "--plain-bn-too", "--max-seconds", "900"]  # both rounds, however busy the machine
TINY_CFG = ["MODEL.VIDEO.RESNET.DEPTH", "10", "MODEL.VIDEO.RESNET.WIDTH", "8"]
TINY_CFG += ["INPUT.VIDEO.TRAIN_CROP_SIZE", "32", "SOLVER.IMS_PER_DEVICE", "2"]
TINY_CFG += ["MULTIGRID.BN_BASE_SIZE", "2"]


def test_speedup_is_the_weighted_sum_of_its_step_times():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, *TINY, *TINY_CFG]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = proc.stdout.rstrip().splitlines()[-1]
    assert line.startswith("GPU-CHECK-FIGURES ")
    fig = json.loads(line.split(" ", 1)[1])
    assert fig["rounds"] == 2 and not fig["stopped_by_time"]

    step_s = {(r["model"], r["shape"]): r["step_ms"] / 1000 for r in fig["shapes"]}
    # base shape 2 x 8 x 32; the long cycle's coarsest shape 2 frames of round(32 / sqrt 2) = 23
    assert ("base", "2x8x32") in step_s and ("multigrid", "2x8x32") in step_s
    # --plain-bn-too: the base model runs every shape too
    assert {shape for m, shape in step_s if m == "base"} == {s for _, s in step_s}
    assert any(shape.endswith("x2x23") for _, shape in step_s)

    base = fig["schedules"]["base"]
    # 100 epochs of 240000 // 2 batches, all at the base shape
    assert base["epochs"] == 100 and base["batches"] == {"2x8x32": 100 * 120000}
    assert set(fig["schedules"]) == {"base"} | {
        f"multigrid x{f}{bn}" for f in ("1", "1.5") for bn in ("", " plain BN")
    }
    for name, sched in fig["schedules"].items():
        model = "multigrid" if name.startswith("multigrid") and "plain" not in name else "base"
        assert sum(sched["batches"].values()) == sched["total_batches"]
        wall = sum(n * step_s[(model, shape)] for shape, n in sched["batches"].items())
        assert abs(wall - sched["train_s"]) <= 1e-9 * wall
    assert fig["schedules"]["multigrid x1"]["epochs"] == 100
    assert fig["schedules"]["multigrid x1.5"]["epochs"] == 150
    for factor in ("1", "1.5"):
        sched = fig["schedules"][f"multigrid x{factor}"]
        assert abs(fig["speedup"][factor] - base["train_s"] / sched["train_s"]) < 1e-12
        assert fig["batch_ratio"][factor] == base["total_batches"] / sched["total_batches"] > 1
        plain = fig["schedules"][f"multigrid x{factor} plain BN"]
        assert plain["batches"] == sched["batches"]
        assert abs(fig["speedup_plain_bn"][factor] - base["train_s"] / plain["train_s"]) < 1e-12
    cost = step_s[("multigrid", "2x8x32")] / step_s[("base", "2x8x32")]
    assert abs(fig["subbatch_bn_cost"] - cost) < 1e-9 * cost
    # per voxel, over the plain-BN model's at the base shape: batch x frames x crop^2
    def vox(shape):
        b, t, c = (int(x) for x in shape.split("x"))
        return b * t * c * c

    base_per_voxel = step_s[("base", "2x8x32")] / vox("2x8x32")
    for r in fig["shapes"]:
        expected = step_s[(r["model"], r["shape"])] / vox(r["shape"]) / base_per_voxel
        assert abs(r["per_voxel_vs_base"] - expected) <= 1e-9 * expected
    assert next(r for r in fig["shapes"] if (r["model"], r["shape"]) == ("base", "2x8x32"))["per_voxel_vs_base"] == 1.0
