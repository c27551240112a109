"""tools/submit.py against a real Slurm (docs/launching.md, "Testing against a real Slurm"):
a CPU run submitted through sbatch, a running job pre-empted with ``scontrol requeue``,
``scancel --signal=TERM --full`` and ``scancel -s USR1 -b`` and each time requeued and
resumed from its checkpoint with no step trained twice, a plain ``scancel`` that cancels (the
checkpoint written, no requeue, the run summary "cancelled"), and the srun mode with 2 tasks
on 1 node. Skipped where no cluster answers ``sinfo`` (``tests/slurm/start_slurm.sh`` starts a
one-node one on Debian, as root)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBMIT = os.path.join(ROOT, "tools", "submit.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


def _cluster() -> str:
    """Why there is no usable cluster, or "" when there is one."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm client (sinfo, sbatch) installed: run tests/slurm/start_slurm.sh as root"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s"
    if states.returncode != 0 or not re.search(r"idle|mixed|allocated", states.stdout):
        return f"no Slurm node up (sinfo: {(states.stdout + states.stderr).strip()[:200]!r})"
    return ""


pytestmark = pytest.mark.skipif(bool(_cluster()), reason=_cluster() or "a Slurm cluster answers")


def _overrides(tiny_shapes, out_dir, max_iter, *extra):
    return [
        "DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", str(tiny_shapes.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(tiny_shapes.num_val), "DATASETS.SHAPES.IMAGE_SIZE",
        str(tiny_shapes.image_size), "DATASETS.SHAPES.SEED", str(tiny_shapes.seed), "DATASETS.TEST", "()",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "2",
        "SOLVER.MAX_ITER", str(max_iter), "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()",
        "SOLVER.CHECKPOINT_PERIOD", "1000", "DATALOADER.NUM_WORKERS", "0", "LOG_PERIOD", "1",
        "SEED", "0", "RESEED_EVERY_ITER", "True", "OUTPUT_DIR", str(out_dir), *extra,
    ]  # fmt: skip


#: a pre-empted run holds after its second step until its signal arrives
#: (tests/launch/holds.py): the signal always comes before the run could end, on any host
HOLD = ("IMPORTS", "('holds',)", "HOOKS", "('HoldAfterSecondStep',)")
HOLDS_DIR = os.path.join(ROOT, "tests", "launch")


def _submit(tmp_path, *args):
    """tools/submit.py through sbatch (the job's environment is this one: sbatch exports
    it, the folder of holds.py on PYTHONPATH); returns the job id."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([HOLDS_DIR] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, SUBMIT, "--gpus-per-node", "0", "--time", "10",
                           "--job-dir", str(tmp_path / "jobs" / "%j"), *args],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job_id,) = re.findall(r"^Submitted job (\d+) ", proc.stdout, re.M)
    return job_id, proc.stdout


def _state(job_id) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True).stdout
    found = re.search(r"JobState=(\w+)", out)
    return found.group(1) if found else "GONE"


def _wait_for(condition, what, deadline_s):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {deadline_s} s waiting for {what}"
        time.sleep(0.5)


def _wait_until_done(job_id, tmp_path, deadline_s=150):
    _wait_for(lambda: _state(job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"),
              f"job {job_id} to end", deadline_s)  # fmt: skip
    logs = tmp_path / "jobs" / job_id
    err = "".join(p.read_text() for p in sorted(logs.glob("*_log.err"))) if logs.is_dir() else ""
    assert _state(job_id) == "COMPLETED", err[-3000:]


def _steps(out_dir):
    return [r["iteration"] for r in map(json.loads, open(out_dir / "metrics.json")) if "total_loss" in r]


def test_a_cpu_run_through_sbatch(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    job_id, printed = _submit(tmp_path, "--cpus-per-gpu", "1", "--sbatch", "comment=largedet-test",
                              "--no-data-check", "--config", CONFIG, *_overrides(tiny_shapes, out, 3))  # fmt: skip
    assert "Data check skipped (--no-data-check)" in printed
    script = next((tmp_path / "jobs" / job_id).glob("*_submission.sh")).read_text()
    assert "#SBATCH --comment=largedet-test" in script and "gpus" not in script and "gres" not in script
    _wait_until_done(job_id, tmp_path)
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["status"] == "finished" and summary["batch"]["world_size"] == 1
    assert _steps(out) == [0, 1, 2] and (out / "model_final.pth").is_file()


#: each way a job is pre-empted: the command (the job id appended) and a line of the job's log
PREEMPTIONS = {
    # Slurm's SIGTERM to every process of the job; the step finished and saved
    "scontrol-requeue": (["scontrol", "requeue"], "exited 75 (pre-empted, checkpoint written)"),
    # the batch shell (the job's task, exec'd), the training and its workers all get SIGTERM:
    # nothing kills the training before it has saved
    "scancel-full": (["scancel", "--signal=TERM", "--full"], "Got SIGTERM: stopping training at the end of its step"),
    # only the batch shell, the job's task: it stops the training, which saves
    "scancel-batch": (["scancel", "-s", "USR1", "-b"], "Got SIGUSR1: stopping training at the end of its step"),
}


def test_each_preemption_ends_in_a_checkpoint_a_requeue_and_a_resume(tiny_shapes, tmp_path):
    """Three jobs of STEPS steps at once (the node runs two), each pre-empted its way once it
    has trained two steps (it holds there until its signal arrives: HOLD): the training
    finishes its step and saves, the job is requeued and resumes at the next step, every
    step once in metrics.json, no exception in its log."""
    jobs = {}
    try:
        for name in PREEMPTIONS:
            out = tmp_path / name / "run"
            opts = _overrides(tiny_shapes, out, STEPS, "SOLVER.BASE_LR", "0.002", *HOLD)
            # held until all are submitted (a submission takes seconds)
            job_id, _ = _submit(tmp_path / name, "--cpus-per-gpu", "1", "--sbatch", "hold", "--config", CONFIG, *opts)
            jobs[name] = [job_id, out, "training"]
        subprocess.run(["scontrol", "release", *(job[0] for job in jobs.values())], check=True)
        _preempt_each(jobs)
    finally:  # no job of this test outlives it
        subprocess.run(["scancel", *(job[0] for job in jobs.values() if job[2] != "done")], capture_output=True)
    for name, (job_id, out, _) in jobs.items():
        _wait_until_done(job_id, tmp_path / name, deadline_s=1)  # COMPLETED, or its log
        summary = json.loads((out / "run_summary.json").read_text())
        first, second = summary["invocations"]
        assert first["status"] == "preempted" and second["status"] == "finished", name
        assert second["start_iter"] == first["end_iter"] and 2 <= first["end_iter"] < STEPS, name
        assert _steps(out) == list(range(STEPS)), name  # each step once: none trained twice, none lost
        log = (out / "log.txt").read_text()
        assert f"pre-empted at iteration {first['end_iter'] - 1} (SIGTERM)" in log, name
        job_log = "".join(p.read_text() for p in sorted((tmp_path / name / "jobs" / job_id).glob("*_log.*")))
        assert PREEMPTIONS[name][1] in job_log, name
        assert "triggered an exception" not in job_log and "CalledProcessError" not in job_log, name


STEPS = 8


def _preempt_each(jobs):
    """Pre-empt each job of ``jobs`` (name: [job id, OUTPUT_DIR, stage]) its way after two
    steps, release it when it is requeued, until every one has ended."""
    deadline = time.monotonic() + 480
    while any(stage != "done" for _, _, stage in jobs.values()):
        assert time.monotonic() < deadline, {name: (job[2], _state(job[0])) for name, job in jobs.items()}
        for name, job in jobs.items():
            job_id, out, stage = job
            if stage == "training" and (out / "metrics.json").is_file() and len(_steps(out)) >= 2:
                subprocess.run([*PREEMPTIONS[name][0], job_id], check=True)
                job[2] = "pre-empted"
            elif stage == "pre-empted" and _state(job_id) == "PENDING":
                # Slurm holds a requeued job back by itself (its begin time about two minutes
                # ahead): start it as soon as it is pending again, as an operator may, so that
                # the test measures largedet's resume, not Slurm's hold
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
                job[2] = "released"
            elif stage == "released" and _state(job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"):
                job[2] = "done"
        time.sleep(0.5)


def test_a_plain_scancel_cancels_with_the_last_checkpoint_kept(tiny_shapes, tmp_path):
    """``scancel JOBID``: the training finishes its step and writes its checkpoint, the run
    summary says "cancelled", and the job ends cancelled instead of coming back."""
    out = tmp_path / "run"
    opts = _overrides(tiny_shapes, out, STEPS, "SOLVER.BASE_LR", "0.002", *HOLD)
    job_id, _ = _submit(tmp_path, "--cpus-per-gpu", "1", "--config", CONFIG, *opts)
    try:
        _wait_for(lambda: (out / "metrics.json").is_file() and len(_steps(out)) >= 2, "two steps", 240)
        subprocess.run(["scancel", job_id], check=True)
        _wait_for(lambda: _state(job_id) in ("CANCELLED", "GONE"), f"job {job_id} to end", 90)
        time.sleep(5)  # a requeue would show here (PENDING)
        assert _state(job_id) in ("CANCELLED", "GONE")
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    summary = json.loads((out / "run_summary.json").read_text())
    (only,) = summary["invocations"]
    assert summary["status"] == only["status"] == "cancelled"
    assert 2 <= only["end_iter"] < STEPS
    assert (out / f"model_{only['end_iter'] - 1:07d}.pth").is_file()
    assert (out / "last_checkpoint").read_text() == f"model_{only['end_iter'] - 1:07d}.pth"
    log = (out / "log.txt").read_text()
    assert f"cancelled (scancel: the job is not requeued) at iteration {only['end_iter'] - 1} (SIGTERM)" in log
    job_log = "".join(p.read_text() for p in sorted((tmp_path / "jobs" / job_id).glob("*_log.*")))
    assert "not requeued" in job_log and "requeuing" not in job_log


def test_srun_mode_two_tasks_on_one_node(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    job_id, printed = _submit(tmp_path, "--srun", "--processes-per-node", "2", "--cpus-per-gpu", "1",
                              "--config", CONFIG, *_overrides(tiny_shapes, out, 2))  # fmt: skip
    assert "one Slurm task each" in printed
    _wait_until_done(job_id, tmp_path)
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["status"] == "finished" and summary["batch"]["world_size"] == 2
    assert _steps(out) == [0, 1]
    # two Slurm tasks of 1 CPU each, the second the process of rank 1 (its own log file)
    script = next((tmp_path / "jobs" / job_id).glob("*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=2" in script and "#SBATCH --cpus-per-task=1" in script
    assert (out / "log.txt.rank1").is_file()
