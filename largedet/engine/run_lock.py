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
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import sys
from typing import Optional

from ..config.validate import ConfigError

__all__ = ["LOCK_FILE", "OutputDirInUseError", "OutputDirLock"]

LOCK_FILE = "run.lock"


class OutputDirInUseError(ConfigError):
    """``OUTPUT_DIR`` belongs to a live run; the message names its process."""


class OutputDirLock:
    """The lock of a run on ``output_dir`` (see the module docstring): :meth:`acquire`, then
    :meth:`release` (or ``with``)."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._fd: Optional[int] = None

    def acquire(self) -> "OutputDirLock":
        """Take the lock, or raise :class:`OutputDirInUseError` naming the live run that holds
        it (one line)."""
        os.makedirs(self.output_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "a process"
            os.close(fd)
            raise OutputDirInUseError(
                f"{self.path}: OUTPUT_DIR {self.output_dir} is in use by a live run ({holder}); "
                "wait for it to end, or give this run another OUTPUT_DIR"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        command = " ".join(sys.argv)
        if len(command) > 200:
            command = command[:197] + "..."
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}: {command}\n".encode())
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
