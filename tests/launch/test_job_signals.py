"""tools/train_net.py as a cluster treats a job: a signal to the whole process group (loader
workers included) on one and two processes, SIGTERM to one launcher of a job with one
process per machine, a second run on a live OUTPUT_DIR, and a log file on a full disk."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from engine_testing import _free_port

from largedet.launch.preemption import PREEMPTED_EXIT_CODE

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _overrides(spec, out, workers=0, max_iter=2000):
    return [
        "DATASETS.SHAPES.ROOT", spec.root, "DATASETS.SHAPES.NUM_TRAIN", str(spec.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(spec.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(spec.image_size),
        "DATASETS.SHAPES.SEED", str(spec.seed), "DATASETS.TEST", "()",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "4",
        "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", str(max_iter), "SOLVER.CHECKPOINT_PERIOD", "5000",
        "DATALOADER.NUM_WORKERS", str(workers), "LOG_PERIOD", "1", "OUTPUT_DIR", str(out),
    ]  # fmt: skip


def _start(args, **kwargs):
    """train_net.py in a session (and process group) of its own, as a job step is started."""
    return subprocess.Popen([sys.executable, TRAIN_NET, "--config", CONFIG, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True, **kwargs)  # fmt: skip


def _wait_for_steps(proc, out, steps, *others):
    """Until ``out/metrics.json`` holds ``steps`` records (the run is training); fails if
    ``proc`` or one of ``others`` ends first or after 300 s."""
    deadline = time.monotonic() + 300
    metrics = out / "metrics.json"
    while not (metrics.exists() and metrics.read_text().count("\n") >= steps):
        for p in (proc, *others):
            assert p.poll() is None, p.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "the run did not reach its steps"
        time.sleep(0.2)


def _group_is_gone(pgid, timeout=30.0) -> bool:
    """Whether no process is left in the process group ``pgid`` (none orphaned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _stopped_at(out) -> int:
    checkpoint = (out / "last_checkpoint").read_text()
    return int(checkpoint[len("model_"):-len(".pth")])


@pytest.mark.parametrize("sig,processes", [(signal.SIGTERM, 1), (signal.SIGINT, 2)])
def test_a_signal_to_the_process_group_with_loader_workers_checkpoints_and_exits_75(
    tiny_shapes, tmp_path, sig, processes
):
    out = tmp_path / "run"
    overrides = _overrides(tiny_shapes, out, workers=2)
    proc = _start(["--num-gpus", str(processes), *overrides])
    _wait_for_steps(proc, out, 2)
    os.killpg(proc.pid, sig)  # every process of the job: launcher, workers, loader workers
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output[-4000:]
    stopped = _stopped_at(out)
    assert f"pre-empted at iteration {stopped} ({sig.name}): checkpoint" in output
    assert "killed by signal" not in output and "Traceback" not in output
    assert _group_is_gone(proc.pid)
    assert json.loads((out / "run_summary.json").read_text())["status"] == "preempted"

    resume = ["--num-gpus", str(processes), "--resume", *overrides, "SOLVER.MAX_ITER", str(stopped + 2)]
    done = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *resume],
                          capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Starting training from iteration {stopped + 1}" in done.stdout + done.stderr
    logged = [json.loads(line)["iteration"] for line in (out / "metrics.json").read_text().splitlines()]
    assert logged == list(range(stopped + 2))  # each step trained (and logged) once


def test_sigterm_to_one_launcher_of_one_process_per_machine_stops_the_job_with_75(tiny_shapes, tmp_path):
    """``--num-gpus 1 --num-machines 2``: two launchers, each starting one worker; SIGTERM to
    machine 1's launcher reaches its worker, both workers stop at the same step, machine 0's
    saves, both launchers exit 75 and leave no process behind."""
    out = tmp_path / "run"
    url = f"tcp://127.0.0.1:{_free_port()}"
    machines = ["--num-gpus", "1", "--num-machines", "2", "--dist-url", url]
    overrides = _overrides(tiny_shapes, out)
    first = _start([*machines, "--machine-rank", "0", *overrides])
    second = _start([*machines, "--machine-rank", "1", *overrides])
    try:
        _wait_for_steps(first, out, 2, second)
        os.kill(second.pid, signal.SIGTERM)  # the launcher only, as `kill <pid>` does
        outputs = [p.communicate(timeout=180)[0] for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [first.returncode, second.returncode] == [PREEMPTED_EXIT_CODE] * 2, outputs[1][-4000:]
    stopped = _stopped_at(out)
    assert f"pre-empted at iteration {stopped} (SIGTERM): checkpoint {out / f'model_{stopped:07d}.pth'}" in outputs[0]
    assert all("Traceback" not in o for o in outputs)
    assert _group_is_gone(first.pid) and _group_is_gone(second.pid)  # no orphaned worker


def test_a_second_run_on_a_live_output_dir_is_refused_and_the_first_is_untouched(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    overrides = _overrides(tiny_shapes, out)
    first = _start(overrides)
    try:
        _wait_for_steps(first, out, 2)
        for extra in ([], ["--resume"]):
            second = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *extra, *overrides],
                                    capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip
            assert second.returncode == 2, second.stderr[-3000:]
            assert second.stdout == ""  # refused before any worker or logger started
            (line,) = [x for x in second.stderr.splitlines() if x.startswith("error:")]
            assert line.startswith(f"error: {out / 'run.lock'}: OUTPUT_DIR {out} is in use by a live run (pid {first.pid} on ")
            assert first.poll() is None
        os.killpg(first.pid, signal.SIGTERM)
        output, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == PREEMPTED_EXIT_CODE, output[-4000:]  # its checkpoint saved as usual
    stopped = _stopped_at(out)
    logged = [json.loads(line)["iteration"] for line in (out / "metrics.json").read_text().splitlines()]
    assert logged == list(range(stopped + 1))  # its metrics alone

    # the dead run's run.lock stays, and blocks nothing
    resume = ["--resume", *overrides, "SOLVER.MAX_ITER", str(stopped + 2)]
    done = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *resume],
                          capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Starting training from iteration {stopped + 1}" in done.stdout + done.stderr


def test_a_full_disk_at_log_txt_is_one_line_and_exit_74(tiny_shapes, tmp_path):
    """log.txt on a device that is always full (``/dev/full``: every write fails with ENOSPC)."""
    out = tmp_path / "run"
    out.mkdir()
    os.symlink("/dev/full", out / "log.txt")
    done = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *_overrides(tiny_shapes, out, max_iter=3)],
                          capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert done.returncode == 74, done.stderr[-4000:]
    errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {out / 'log.txt'}: no space left on the device")
    assert "Logging error" not in done.stderr and "Traceback" not in done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["status"] == "failed" and summary["invocations"][-1]["end_iter"] == 0
