"""What a training process needs to take part in an elastic ``torchrun`` job::

    torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --rdzv-id JOB --max-restarts 3 tools/train_net.py --config CFG

When a machine is lost, the survivors' next collective fails (at once where the lost
processes' connections were reset, within ``DISTRIBUTED.TIMEOUT_S`` where the machine went
silent). Each survivor then exits in one line with :data:`LOST_PROCESS_EXIT_CODE`
(:func:`is_lost_process`, :class:`LostProcessError`); torchrun's agent restarts the
workers on the machines that are left, or on more when one comes back. A restarted worker
resumes from the newest complete checkpoint of ``OUTPUT_DIR`` (:func:`torchrun_resume_reason`):
the global batch stays ``SOLVER.IMS_PER_BATCH`` and K absorbs the new world size.

A worker knows it is a restart from ``TORCHELASTIC_RESTART_COUNT`` > 0 (a restart after a
failure), or from ``OUTPUT_DIR/torchrun_job.json`` naming its own job
(``TORCHELASTIC_RUN_ID``, torchrun's ``--rdzv-id``): a restart for a machine that joins
counts no failure, and a machine that joins has its own count. A leaf: torch only.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Optional

import torch.distributed as dist

__all__ = [
    "AGENT_ENVIRONMENT",
    "JOB_FILE",
    "LOST_PROCESS_EXIT_CODE",
    "LostProcessError",
    "is_lost_process",
    "record_torchrun_job",
    "recorded_torchrun_job",
    "torchrun_job_id",
    "torchrun_resume_reason",
]

#: exit status of a process whose collective failed because another process of the job was
#: lost (sysexits' EX_UNAVAILABLE); torchrun's agent restarts on any non-zero status
LOST_PROCESS_EXIT_CODE = 69
#: what torchrun's agents of an elastic job need in their environment: each rendezvous round
#: publishes its own ``MASTER_ADDR``/``MASTER_PORT`` for the workers' store. With the agent's
#: store shared with the workers (torch's default since 2.4), a round that admits a machine
#: never publishes them on the agent that was rank 0 before, and every agent waits for them
#: until its rendezvous times out (seen with torch 2.14; docs/launching.md, "Elastic runs").
AGENT_ENVIRONMENT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
#: the file of ``OUTPUT_DIR`` naming the torchrun job whose run it holds
JOB_FILE = "torchrun_job.json"
#: torchrun's run id when ``--rdzv-id`` is not given: it names no job
_NO_RUN_ID = "none"

# what gloo's transport raises (as RuntimeError) when a peer's connection is reset or
# closed, or when a peer stays silent past the process group's timeout
_GLOO_PEER_FAILURE = re.compile(
    r"gloo/transport/|Connection (reset|closed) by peer|Timed out waiting \d+ms|"
    r"Application timeout caused pair closure|Broken pipe"
)


class LostProcessError(RuntimeError):
    """A collective failed: another process of the job was lost (one line)."""


def is_lost_process(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another process of the job
    ended or went silent: torch.distributed's own errors (``DistError``: NCCL's, the
    store's, network errors) and gloo's transport errors (reset, closed, timed out), which
    reach Python as ``RuntimeError``."""
    if isinstance(error, LostProcessError):
        return True
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and bool(_GLOO_PEER_FAILURE.search(str(error)))


def torchrun_job_id() -> Optional[str]:
    """This torchrun job's run id (``--rdzv-id``), or None outside torchrun and for
    torchrun's default id, which names no job."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return None if run_id in (None, "", _NO_RUN_ID) else run_id


def recorded_torchrun_job(output_dir: str) -> Optional[str]:
    """The run id of the torchrun job that last started a run on ``output_dir``, or None."""
    try:
        with open(os.path.join(output_dir, JOB_FILE)) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def record_torchrun_job(output_dir: str) -> None:
    """Name this torchrun job (:func:`torchrun_job_id`) in ``output_dir`` as the one whose
    run the folder holds (written atomically; nothing outside a named job). Called by the
    process that holds the folder's run lock."""
    run_id = torchrun_job_id()
    if run_id is None:
        return
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    path = os.path.join(output_dir, JOB_FILE)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"run_id": run_id, "started": started}, f)
    os.replace(tmp, path)


def torchrun_resume_reason(output_dir: str) -> Optional[str]:
    """Why this torchrun worker continues the run of ``output_dir`` rather than start a
    fresh one, in words, or None (a fresh start): a restart after a failure
    (``TORCHELASTIC_RESTART_COUNT`` > 0), or the folder's run being this job's
    (:func:`recorded_torchrun_job`), as after a restart that admits a machine."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    job = torchrun_job_id()
    if restarts > 0:
        return f"restart {restarts} of torchrun job {os.environ.get('TORCHELASTIC_RUN_ID')!r}"
    if job is not None and recorded_torchrun_job(output_dir) == job:
        return f"OUTPUT_DIR holds the run of this torchrun job {job!r} ({JOB_FILE})"
    return None
