"""projects/video/benchmarks/shift_cost.py on the CPU at tiny sizes: its figures line."""

import json
import os
import subprocess
import sys

VIDEO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(VIDEO_ROOT, "benchmarks", "shift_cost.py")
TINY = ["--device", "cpu", "--depth", "10", "--width", "8", "--size", "32", "--batch", "2"]
TINY += ["--steps", "1", "--warmup", "1", "--shift-reps", "1"]


def figures_of(args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, *TINY, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("GPU-CHECK-FIGURES ")]
    assert len(lines) == 1 and proc.stdout.rstrip().endswith(lines[0]), proc.stdout
    return json.loads(lines[0].split(" ", 1)[1])


def test_ratios_per_implementation_and_amp_mode():
    # a limit far above what two rounds take, however busy the machine: both rounds complete
    fig = figures_of(["--impls", "slices", "triton", "--amp", "none", "bf16", "--rounds", "2", "--max-seconds", "900"])
    keys = [f"{amp}/{impl}" for amp in ("none", "bf16") for impl in ("slices", "triton")]
    assert fig["exact"] == dict.fromkeys(keys, True)
    assert fig["rounds"] == {"none": 2, "bf16": 2} and not fig["stopped_by_time"]
    for amp in ("none", "bf16"):
        for impl in ("slices", "triton"):
            key = f"{amp}/{impl}"
            lo, hi = fig["ratio_range"][key]
            assert lo <= fig["ratio"][key] <= hi
            assert fig["meets_goal"][key] == (fig["ratio"][key] <= 1.03)
            assert fig["shift_ms"][key] > 0
        for model in ("TSN", "TSM slices", "TSM triton"):
            lo, hi = fig["step_ms_range"][f"{amp}/{model}"]
            assert 0 < lo <= fig["step_ms"][f"{amp}/{model}"] <= hi


def test_time_limit_stops_a_step_and_still_prints_the_figures():
    # a round of 10^5 steps cannot end in time: the alarm stops it inside a step
    # (30 s: the models and the exactness check come first, slowly on a busy machine)
    fig = figures_of(["--impls", "slices", "--steps", "100000", "--max-seconds", "30"])
    assert fig["stopped_by_time"] and fig["elapsed_s"] < 45
    assert fig["rounds"] == {} and fig["ratio"] == {} and fig["exact"] == {"none/slices": True}
