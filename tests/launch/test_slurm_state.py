"""Whether a signal is Slurm's cancel: the job's record (``scontrol show job``) says it is
ending, was not requeued and has time left; a stop that comes back (``scancel --signal``, a
requeue, the time limit) and a process outside Slurm are no cancel."""

import os
import stat

import pytest

from largedet.launch.slurm_state import slurm_job_cancelled

RECORD = ("JobId=7 JobName=largedet UserId=u(1) JobState={state} Reason=None Requeue=1 Restarts={restarts} "
          "BatchFlag=1 RunTime={run} TimeLimit=00:10:00 StartTime=2026-12-01T10:00:00")  # fmt: skip


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A ``scontrol`` on PATH that prints the record it is given."""
    def record(state="COMPLETING", restarts=0, run="00:01:00", exit_status=0):
        script = tmp_path / "scontrol"
        text = RECORD.format(state=state, restarts=restarts, run=run)
        script.write_text(f"#!/bin/sh\necho '{text}'\nexit {exit_status}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return record


@pytest.mark.parametrize(
    "record, restart_count, cancelled",
    [
        (dict(state="COMPLETING"), "0", True),  # scancel JOBID
        (dict(state="CANCELLED"), "0", True),
        (dict(state="RUNNING"), "0", False),  # scancel --signal=TERM (--full, -b)
        (dict(state="COMPLETING", restarts=1), "0", False),  # scontrol requeue, PreemptMode=REQUEUE
        (dict(state="COMPLETING", restarts=2), "2", True),  # cancelled after two requeues
        (dict(state="COMPLETING", run="00:10:00"), "0", False),  # the time limit
        (dict(state="COMPLETING", exit_status=1), "0", False),  # no record: taken as a pre-emption
    ],
)  # fmt: skip
def test_only_a_cancel_is_a_cancel(scontrol, record, restart_count, cancelled):
    scontrol(**record)
    environ = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": restart_count}
    assert slurm_job_cancelled(environ) is cancelled


def test_outside_slurm_nothing_is_a_cancel(scontrol):
    scontrol(state="CANCELLED")
    assert slurm_job_cancelled({}) is False
