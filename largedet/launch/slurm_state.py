"""What a signal from Slurm means: a cancel, or a stop to come back from.

``scancel JOBID`` (without ``--signal``) ends a job: Slurm marks it cancelled and sends SIGTERM
to every process of it, then SIGKILL after ``KillWait``. A pre-emption, a requeue (``scontrol
requeue``), the time limit and a user's own ``scancel --signal`` send signals too, but they
mean "stop and come back". The signal alone does not tell them apart; the job's record does:
:func:`slurm_job_cancelled` reads it with ``scontrol show job`` and says whether this job is
being cancelled (it is ending, neither requeued nor out of time), so that a cancelled run
stops with its checkpoint and is not requeued.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from typing import Dict, Optional

__all__ = ["job_record", "slurm_job_cancelled"]

logger = logging.getLogger(__name__)

#: Job states of a job that goes on running (a signal to it is a stop to come back from)
_LIVE_STATES = ("RUNNING", "SUSPENDED", "PENDING", "CONFIGURING", "RESIZING")
#: seconds ``scontrol`` gets to answer
_SCONTROL_TIMEOUT_S = 10


def job_record(job_id: str) -> Optional[Dict[str, str]]:
    """The fields of ``scontrol show job -o JOB_ID`` (``{"JobState": "RUNNING", ...}``), or
    None where ``scontrol`` is missing, fails or does not answer in time."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=_SCONTROL_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.warning("scontrol show job %s: %s; the signal is taken as a pre-emption", job_id, e)
        return None
    if done.returncode != 0:
        return None
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def _seconds(duration: str) -> Optional[int]:
    """Seconds of a Slurm duration ``[D-]HH:MM:SS`` (or ``MM:SS``); None for another text
    (``UNLIMITED``)."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", duration)
    if not match:
        return None
    days, hours, minutes, seconds = (int(x or 0) for x in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_job_cancelled(environ: Optional[Dict[str, str]] = None) -> bool:
    """Whether this process's Slurm job (``SLURM_JOB_ID`` of ``environ``, default the
    process's environment) is being cancelled: its record says it is ending (not
    ``RUNNING``: ``scancel --signal`` leaves it running), it was not requeued (its
    ``Restarts`` are still ``SLURM_RESTART_COUNT``) and it has time left (``RunTime`` under
    ``TimeLimit``). False outside Slurm and where the record cannot be read: a stop then
    requeues, as a pre-emption."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id:
        return False
    record = job_record(job_id)
    if record is None or record.get("JobState", "RUNNING") in _LIVE_STATES:
        return False
    if int(record.get("Restarts", "0") or 0) > int(environ.get("SLURM_RESTART_COUNT", "0") or 0):
        return False  # scontrol requeue, a pre-emption that requeues
    run, limit = _seconds(record.get("RunTime", "")), _seconds(record.get("TimeLimit", ""))
    if run is not None and limit is not None and run >= limit:
        return False  # the time limit
    return True
