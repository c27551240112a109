"""The pieces of elastic torchrun runs, each alone and fast: the process group's timeout from
the config, a lost process told from other errors, a restarted worker's resume, the run lock
of the same job, K on a new world size. The two-machine job: test_elastic_two_machines.py."""

import datetime
import importlib
import os
import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from detectron2.config import get_cfg

from largedet.config import add_largedet_config
from largedet.engine import defaults
from largedet.launch import job
from largedet.launch.elastic import (
    JOB_FILE,
    LOST_PROCESS_EXIT_CODE,
    LostProcessError,
    is_lost_process,
    record_torchrun_job,
    recorded_torchrun_job,
    torchrun_resume_reason,
)
from largedet.launch.run_lock import OutputDirInUseError, OutputDirLock
from largedet.solver.batch import batch_plan

# the module (largedet.engine's `launch` is its function)
launch = importlib.import_module("largedet.launch.processes")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


class Launched(Exception):
    pass


def _torchrun_env(monkeypatch, run_id="job-7", restarts="0", rank="0", world="1"):
    for name, value in {
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": restarts,
        "TORCHELASTIC_MAX_RESTARTS": "3", "LOCAL_RANK": rank, "RANK": rank, "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": world,
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def test_the_timeout_key_is_declared_with_a_default_well_under_torchruns():
    cfg = add_largedet_config(get_cfg())
    assert cfg.DISTRIBUTED.TIMEOUT_S == 120.0
    args = defaults.largedet_argument_parser().parse_args(["--config", CONFIG, "DISTRIBUTED.TIMEOUT_S", "42"])
    assert defaults.config_timeout_s(args) == 42.0


def test_the_timeout_reaches_init_process_group_under_torchrun(monkeypatch, tmp_path):
    _torchrun_env(monkeypatch)
    seen = {}

    def init_process_group(backend, init_method, timeout):
        seen["timeout"] = timeout
        raise Launched

    monkeypatch.setattr(launch.dist, "init_process_group", init_process_group)
    args = defaults.largedet_argument_parser().parse_args(["--config", CONFIG, "DISTRIBUTED.TIMEOUT_S", "7.5"])
    with pytest.raises(Launched):
        job.check_and_launch(lambda a: None, args, lambda a: None, timeout_s=defaults.config_timeout_s)
    assert seen["timeout"] == datetime.timedelta(seconds=7.5)


def test_the_timeout_reaches_detectron2s_launch(monkeypatch):
    seen = {}

    def d2_launch(fn, num_gpus, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(launch, "d2_launch", d2_launch)
    args = defaults.largedet_argument_parser().parse_args(["--num-gpus", "2"])
    job.check_and_launch(lambda a: None, args, lambda a: None, timeout_s=lambda a: 30.0)
    assert seen["timeout"] == datetime.timedelta(seconds=30)
    # a script that reads no config gets the key's default
    job.check_and_launch(lambda a: None, args, lambda a: None)
    assert seen["timeout"] == datetime.timedelta(seconds=120)


@pytest.mark.parametrize(
    "message",
    [
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [10.253.0.2]:33179: "
        "Connection reset by peer. This is typically caused by a remote worker hanging",
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
        "for recv operation to complete",
        "Application timeout caused pair closure",
    ],
)
def test_glooS_peer_failures_are_a_lost_process(message):
    assert is_lost_process(RuntimeError(message))


def test_other_errors_are_not_a_lost_process():
    assert is_lost_process(LostProcessError("iteration 3"))
    assert is_lost_process(dist.DistBackendError("NCCL communicator was aborted"))
    assert not is_lost_process(RuntimeError("CUDA out of memory"))
    assert not is_lost_process(ValueError("Connection reset by peer"))


def test_a_lost_process_is_one_line_and_exit_69(capsys, monkeypatch):
    def main(args):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer")

    def leave(code):  # the process leaves without the interpreter's shutdown
        raise SystemExit(code)

    monkeypatch.setattr(launch.os, "_exit", leave)
    monkeypatch.setattr(launch.logging, "shutdown", lambda: None)

    with pytest.raises(SystemExit) as stop:
        launch._run_then_shut_down(main, None)
    assert stop.value.code == LOST_PROCESS_EXIT_CODE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: rank 0: a process of the job was lost (") and "exiting with 69" in line


def test_restart_detection(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert torchrun_resume_reason(str(tmp_path)) is None  # not under torchrun
    _torchrun_env(monkeypatch, restarts="2")
    assert torchrun_resume_reason(str(tmp_path)) == "restart 2 of torchrun job 'job-7'"
    # a restart that admits a machine counts no failure: the folder names the job
    _torchrun_env(monkeypatch, restarts="0")
    assert torchrun_resume_reason(str(tmp_path)) is None
    record_torchrun_job(str(tmp_path))
    assert recorded_torchrun_job(str(tmp_path)) == "job-7"
    assert "this torchrun job 'job-7'" in torchrun_resume_reason(str(tmp_path))
    _torchrun_env(monkeypatch, run_id="another-job")
    assert torchrun_resume_reason(str(tmp_path)) is None
    # torchrun's default run id names no job: nothing recorded, nothing matched
    _torchrun_env(monkeypatch, run_id="none")
    (tmp_path / JOB_FILE).unlink()
    record_torchrun_job(str(tmp_path))
    assert not (tmp_path / JOB_FILE).exists() and torchrun_resume_reason(str(tmp_path)) is None


def _previous_run(folder):
    folder.mkdir()
    (folder / "last_checkpoint").write_text("model_0000003.pth")
    (folder / "model_0000003.pth").write_bytes(b"")
    (folder / "metrics.json").write_text('{"iteration": 0}\n')


@pytest.mark.parametrize("run_id, restarts, resumes", [("job-7", "0", True), ("job-8", "0", False), ("job-8", "1", True)])
def test_a_restarted_worker_resumes_and_the_fresh_run_guard_lets_it(monkeypatch, tmp_path, capsys, run_id, restarts, resumes):
    """The folder's run was started by torchrun job job-7: its restarts (and a restart of any
    job after a failure) resume; another job's fresh start is refused as before."""
    folder = tmp_path / "run"
    _previous_run(folder)
    _torchrun_env(monkeypatch, run_id="job-7")
    record_torchrun_job(str(folder))
    _torchrun_env(monkeypatch, run_id=run_id, restarts=restarts)
    seen = {}

    def fake_launch(main_func, args, timeout):
        seen["resume"] = args.resume

    monkeypatch.setattr(job, "launch", fake_launch)
    args = defaults.largedet_argument_parser().parse_args(["--config", CONFIG])
    if resumes:
        job.check_and_launch(lambda a: None, args, lambda a: None, output_dir=lambda a: str(folder))
        assert seen["resume"] is True
        assert capsys.readouterr().err.endswith(f": resuming from the newest complete checkpoint of {folder}\n")
        assert recorded_torchrun_job(str(folder)) == run_id
    else:
        with pytest.raises(SystemExit) as stop:
            job.check_and_launch(lambda a: None, args, lambda a: None, output_dir=lambda a: str(folder))
        assert stop.value.code == 2 and "holds a previous run's results" in capsys.readouterr().err


def test_every_process_follows_the_first_ones_decision(monkeypatch):
    monkeypatch.setattr(job.comm, "all_gather", lambda value: [True, value])
    args = defaults.largedet_argument_parser().parse_args([])
    assert job._resume_as_the_first_process(lambda a: a.resume, args) is True


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)  # no earlier holder's longer text left behind
os.write(fd, sys.argv[2].encode())
print("held", flush=True)
time.sleep(float(sys.argv[3]))
open(sys.argv[1] + ".slept", "w").close()  # before the exit releases the lock
"""


def _held(folder, holder, seconds):
    folder.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder / "run.lock"), holder, str(seconds)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline() == "held\n"
    return proc


def test_the_run_lock_waits_for_a_holder_of_the_same_job(monkeypatch, tmp_path):
    _torchrun_env(monkeypatch, run_id="job-7")
    holder = _held(tmp_path, "pid 1 on a (torchrun job 'job-7'), since then: train_net.py", 1.5)
    start = time.monotonic()
    lock = OutputDirLock(str(tmp_path)).acquire(same_job_wait_s=30)
    assert time.monotonic() - start < 30
    assert (tmp_path / "run.lock.slept").exists()  # it waited for the holder to be done
    assert "(torchrun job 'job-7')" in (tmp_path / "run.lock").read_text()
    lock.release()
    holder.wait()
    # another job's live run is refused at once, however long the wait allowed
    other = _held(tmp_path, "pid 1 on a (torchrun job 'job-8'), since then: train_net.py", 30)
    try:
        start = time.monotonic()
        with pytest.raises(OutputDirInUseError):
            OutputDirLock(str(tmp_path)).acquire(same_job_wait_s=30)
        assert time.monotonic() - start < 20  # not the 30 s the wait allowed
    finally:
        other.kill()
        other.wait()


def test_k_absorbs_a_new_world_size():
    """The global batch stays SOLVER.IMS_PER_BATCH: K = batch / (world size x per device)."""
    cfg = add_largedet_config(get_cfg())
    cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.IMS_PER_DEVICE = 1056, 4
    plans = {world: batch_plan(cfg, world) for world in (264, 132, 66, 33)}
    assert {w: p.accumulation for w, p in plans.items()} == {264: 1, 132: 2, 66: 4, 33: 8}
    assert {p.global_batch for p in plans.values()} == {1056}
