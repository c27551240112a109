"""benchmarks/gpu_check.py end to end on the CPU: the dry run executes every step of the GPU
suite on tiny sizes, records each in results.json with the figures parsed from its output,
writes the summary and the archive; run again, it skips the steps that passed."""

import json
import os
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")
STEPS = [
    "cuda-tests",
    "video-shift",
    "trainer-vs-detectron2",
    "loader-speed",
    "multigrid-r50",
    "optimizer-step",
    "train-throughput-bf16",
    "train-throughput-fp16",
    "video-throughput",
    "multigrid",
]
CUDA_TESTS = 22  # the tests under tests/cuda, all skipped without a GPU


def dry_run(tmp_path, *extra):
    """The driver as a subprocess (one torch thread per step), with a wheel folder that does
    not exist: nothing is installed."""
    cmd = [sys.executable, SCRIPT, "--dry-run", "--output", str(tmp_path / "gpu_check")]
    cmd += ["--wheels", str(tmp_path / "no_wheels"), "--site", str(tmp_path / "site"), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "gpu_check" / "results.json") as f:
        return proc.stdout, json.load(f)


def test_dry_run_records_every_step_and_a_rerun_skips_them(tmp_path):
    archive = tmp_path / "gpu_check.tar.gz"
    _, results = dry_run(tmp_path, "--archive", str(archive))
    out = tmp_path / "gpu_check"

    assert results["dry_run"] is True and results["environment"]["missing"] == {}
    assert list(results["steps"]) == STEPS
    for name, record in results["steps"].items():
        assert record["status"] == "passed" and record["exit_code"] == 0, (name, record)
        assert "missing_figures" not in record and "parse_error" not in record, name
        assert record["command"][0] == "python" and record["wall_s"] > 0
        assert record["device"] and record["torch"] and record["date"]
        assert (out / record["log"]).is_file()

    figures = {name: record["figures"] for name, record in results["steps"].items()}
    tests = figures["cuda-tests"]
    assert (tests["passed"], tests["failed"], tests["errors"]) == (0, 0, 0)
    assert tests["skipped"] == CUDA_TESTS
    shift = figures["video-shift"]
    assert set(shift["ratio"]) == {"none/slices", "none/triton", "none/compiled"}
    assert all(shift["exact"].values()) and shift["errors"] == {}
    trainers = figures["trainer-vs-detectron2"]
    assert trainers["ims_per_batch"] == [1, 2] and trainers["ratio_min"] > 0
    assert trainers["ratio_min"] == min(trainers["ratio_b1"], trainers["ratio_b2"])
    loader = figures["loader-speed"]
    assert loader["workers"] == [0, 1] and loader["images_w1"] == loader["requested_w1"]
    multigrid_speed = figures["multigrid-r50"]
    assert set(multigrid_speed["speedup"]) == {"1", "1.5"} and multigrid_speed["errors"] == {}
    optimizers = figures["optimizer-step"]["step_ms"]
    assert {"PMD-LAMB (multi-tensor)", "PMD-LAMB (compiled)", "LAMB", "LARS",
            "AdamW(foreach=True)"} <= set(optimizers)  # fmt: skip
    assert all(ms > 0 for ms in optimizers.values())
    profile = figures["optimizer-step"]["profile"]  # on the CPU: no device kernels
    assert set(profile) == {"PMD-LAMB (multi-tensor)", "AdamW(foreach=True)",
                            "AdamW(fused=True)", "SGD(foreach=True, momentum=0.9)"}  # fmt: skip
    assert all(p["kernels_per_step"] == 0 and p["wall_ms"] > 0 for p in profile.values())
    first_step = figures["optimizer-step"]["first_step_s"]
    assert set(first_step) == {"PMD-LAMB (compiled)", "LAMB (compiled)", "LARS (compiled)"}
    for amp in ("bf16", "fp16"):
        train = figures[f"train-throughput-{amp}"]
        assert set(train["images_per_s"]) == {"sgd", "pmdlamb", "pmdlamb_k8"}
        assert train["pmdlamb_vs_sgd"] > 0 and train["k8_vs_k1"] > 0
        assert len(train["profile_top3_cpu"]) == 3
        assert all(op["op"] and op["ms"] > 0 for op in train["profile_top3_cpu"])
    video = figures["video-throughput"]
    models = {"TSN", "TSM", "TSM (naive shift)", "I3D 3x3x3", "I3D 3x1x1"}
    assert set(video["clips_per_s"]) == models
    assert video["tsm_vs_i3d_3x3x3"] > 0 and video["tsm_vs_i3d_3x1x1"] > 0
    multigrid = figures["multigrid"]
    runs = {"base shape", "multigrid, 1.5x epochs", "multigrid, 1x epochs"}
    assert set(multigrid["runs"]) == runs
    assert set(multigrid["speedup"]) == set(multigrid["top1_diff"]) == {"1.5x", "1x"}
    # the third run's line once: each run's log handlers are removed after it
    assert (out / "multigrid.log").read_text().count("multigrid, 1x epochs: {") == 1

    summary = (out / "summary.md").read_text()
    assert "dry run" in summary
    assert all(f"| {name}: " in summary and "| passed |" in summary for name in STEPS)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    expected = {"results.json", "summary.md", "cuda-tests.xml"} | {f"{n}.log" for n in STEPS}
    assert names == {f"gpu_check/{name}" for name in expected}

    stdout, again = dry_run(tmp_path)
    assert stdout.count("skipped (--force runs it again)") == len(STEPS)
    assert again["steps"] == results["steps"]


def test_the_optimizer_profile_is_read_from_the_benchmark_output():
    """Two lines of the H100 run (2026-11-26, lease 3) and a kernel row, read exactly."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        from gpu_checks.optimizer_step import parse_optimizer_step
    finally:
        sys.path.pop(0)
    output = (
        "profile PMD-LAMB (multi-tensor): 40 kernels per step, 1.43 ms of kernels in 2.73 ms "
        "wall (52%); at least 1.16 GB moved per step (814 GB/s over the kernels' time)\n"
        "     0.235 ms/step     2/step  void at::native::multi_tensor_apply_kernel<...>\n"
        "profile AdamW(fused=True): 6 kernels per step, 0.45 ms of kernels in 0.63 ms wall "
        "(70%); at least 1.16 GB moved per step (2601 GB/s over the kernels' time)\n"
    )
    assert parse_optimizer_step(output, "")["profile"] == {
        "PMD-LAMB (multi-tensor)": {"kernels_per_step": 40.0, "kernel_ms": 1.43,
                                    "wall_ms": 2.73, "least_gb": 1.16, "gb_per_s": 814.0},
        "AdamW(fused=True)": {"kernels_per_step": 6.0, "kernel_ms": 0.45, "wall_ms": 0.63,
                              "least_gb": 1.16, "gb_per_s": 2601.0},
    }  # fmt: skip
