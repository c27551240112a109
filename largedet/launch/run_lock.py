"""One live run per ``OUTPUT_DIR``.

Two runs writing one folder would remove each other's temporary checkpoints, tag each
other's checkpoints and interleave ``metrics.json`` and ``log.txt``. The process that
launches a run (the training script's own process; under torchrun, the process of rank 0;
with several machines, machine 0's) takes an exclusive ``flock`` on ``OUTPUT_DIR/run.lock``
before any worker process starts and holds it until the run ends, and writes into the file
which process holds it. A second run on the folder, a ``--resume`` included, is refused with
:class:`OutputDirInUseError` naming that process. The operating system drops the lock when
its process ends, however it ends (a kill -9, a crash), so a dead run's ``run.lock`` never
blocks the next run: the file is left in place, and only the lock counts.

A fresh run (no ``--resume``) on a folder that holds a previous run's results (checkpoints,
``metrics.json`` records: :func:`previous_results`) would write over its checkpoints and
append its steps to the same ``metrics.json``; :func:`claim_for_fresh_run`, called under
the lock, refuses it with :class:`PreviousRunError` or, with ``--overwrite``, moves the
folder's files aside first.
"""

from __future__ import annotations

import datetime
import fcntl
import glob
import os
import socket
import sys
import time
from typing import List, Optional

from ..config.errors import ConfigError
from .elastic import torchrun_job_id

__all__ = [
    "LOCK_FILE",
    "OutputDirInUseError",
    "OutputDirLock",
    "PreviousRunError",
    "claim_for_fresh_run",
    "previous_results",
]

LOCK_FILE = "run.lock"
#: the folder of OUTPUT_DIR that ``--overwrite`` moves a previous run's files into
#: (``overwritten_<UTC time>``)
OVERWRITTEN_PREFIX = "overwritten_"


class OutputDirInUseError(ConfigError):
    """``OUTPUT_DIR`` belongs to a live run; the message names its process."""


class PreviousRunError(ConfigError):
    """A fresh run on an ``OUTPUT_DIR`` that holds a previous run's results (one line)."""


class OutputDirLock:
    """The lock of a run on ``output_dir`` (see the module docstring): :meth:`acquire`, then
    :meth:`release` (or ``with``)."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._fd: Optional[int] = None

    def acquire(self, same_job_wait_s: float = 0.0) -> "OutputDirLock":
        """Take the lock, or raise :class:`OutputDirInUseError` naming the live run that holds
        it (one line). Under torchrun, a lock held by a process of the same job (its
        ``--rdzv-id``, which the holder wrote into the file) is waited for up to
        ``same_job_wait_s`` seconds: a worker of the job's last round on a lost machine
        ends within the process group's timeout, and the restarted job takes the lock over."""
        os.makedirs(self.output_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        job = torchrun_job_id()
        mark = f"(torchrun job {job!r})" if job else None
        deadline = time.monotonic() + same_job_wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    os.lseek(fd, 0, os.SEEK_SET)
                    holder = os.read(fd, 4096).decode(errors="replace").strip() or "a process"
                    if mark is None or mark not in holder or time.monotonic() > deadline:
                        raise OutputDirInUseError(
                            f"{self.path}: OUTPUT_DIR {self.output_dir} is in use by a live run "
                            f"({holder}); wait for it to end, or give this run another OUTPUT_DIR"
                        ) from None
                    time.sleep(0.5)
        except BaseException:
            os.close(fd)
            raise
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        command = " ".join(sys.argv)
        if len(command) > 200:
            command = command[:197] + "..."
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        where = f"pid {os.getpid()} on {socket.gethostname()}{' ' + mark if mark else ''}"
        os.write(fd, f"{where}, since {started}: {command}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the lock; the file stays for the next run
            self._fd = None

    def __enter__(self) -> "OutputDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def previous_results(output_dir: str) -> List[str]:
    """The files of ``output_dir`` that show a previous run: ``last_checkpoint``,
    ``model_*.pth`` and a ``metrics.json`` holding a record (names, sorted)."""
    found = [os.path.basename(p) for p in glob.glob(os.path.join(output_dir, "model_*.pth"))]
    if os.path.isfile(os.path.join(output_dir, "last_checkpoint")):
        found.append("last_checkpoint")
    metrics = os.path.join(output_dir, "metrics.json")
    try:
        if os.path.isfile(metrics):  # a regular file (not /dev/full, which reads without end)
            with open(metrics, "rb") as f:
                if f.read(4096).strip():
                    found.append("metrics.json")
    except OSError:
        pass
    return sorted(found)


def claim_for_fresh_run(output_dir: str, overwrite: bool) -> Optional[str]:
    """Make ``output_dir`` ready for a fresh run, called by the process that holds its
    :class:`OutputDirLock`. Where it holds a previous run's results
    (:func:`previous_results`), raise :class:`PreviousRunError` naming the folder,
    ``--resume`` and ``--overwrite``; with ``overwrite``, move every file and folder of it
    but the lock and earlier such folders into ``OUTPUT_DIR/overwritten_<UTC time>`` and
    return that folder's path. Returns None for a folder without results."""
    found = previous_results(output_dir)
    if not found:
        return None
    if not overwrite:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise PreviousRunError(
            f"OUTPUT_DIR {output_dir} holds a previous run's results ({shown}); pass --resume to "
            "continue that run, or --overwrite to start a new one (its files are moved to "
            f"{os.path.join(output_dir, OVERWRITTEN_PREFIX)}<time>/)"
        )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    aside = os.path.join(output_dir, OVERWRITTEN_PREFIX + stamp)
    os.makedirs(aside)
    for name in sorted(os.listdir(output_dir)):
        if name == LOCK_FILE or name.startswith(OVERWRITTEN_PREFIX):
            continue
        os.replace(os.path.join(output_dir, name), os.path.join(aside, name))
    return aside
