"""The training loader's worker processes: signals to the job are the main process's
(:func:`loader_worker_init`), and workers that a signal left behind are ended when the main
process exits (:func:`end_loader_workers_at_exit`)."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
from typing import Callable, Sequence

from detectron2.config import CfgNode
from detectron2.data.build import worker_init_reset_seed

__all__ = [
    "JOB_SIGNALS",
    "end_loader_workers_at_exit",
    "ignore_job_signals",
    "loader_worker_init",
    "worker_init_fn",
]

logger = logging.getLogger(__name__)

#: what loader workers always ignore: what a cluster (SIGTERM) and Ctrl-C (SIGINT) send to
#: every process of the job, the workers included
JOB_SIGNALS = ("SIGTERM", "SIGINT")


def ignore_job_signals(names: Sequence[str] = ()) -> None:
    """Ignore :data:`JOB_SIGNALS` and the signals ``names`` (``PREEMPTION.SIGNALS``) in this
    process: a loader worker that a signal to the whole process group killed would end the
    run with PyTorch's ``DataLoader worker ... is killed by signal`` before the main process
    writes its pre-emption checkpoint. A worker still ends with the main process (PyTorch
    stops its workers, and a worker whose parent died exits)."""
    for name in dict.fromkeys((*JOB_SIGNALS, *names)):
        signal.signal(signal.Signals[name], signal.SIG_IGN)


def loader_worker_init(worker_id: int, signals: Sequence[str] = ()) -> None:
    """Every largedet loader's ``worker_init_fn``: :func:`ignore_job_signals` (``signals``:
    ``PREEMPTION.SIGNALS``), then Detectron2's ``worker_init_reset_seed``."""
    ignore_job_signals(signals)
    worker_init_reset_seed(worker_id)


def worker_init_fn(cfg: CfgNode) -> Callable[[int], None]:
    """The training loader's ``worker_init_fn``: :func:`loader_worker_init` with
    ``PREEMPTION.SIGNALS``; with workers, they are ended when the main process exits."""
    if cfg.DATALOADER.NUM_WORKERS > 0:
        end_loader_workers_at_exit()
    return functools.partial(loader_worker_init, signals=tuple(cfg.PREEMPTION.SIGNALS))


@functools.lru_cache(maxsize=None)
def end_loader_workers_at_exit() -> None:
    """Once per process: as it exits, kill the loader workers still alive, before
    ``multiprocessing`` sends its daemonic children SIGTERM and waits for them.

    A loader whose iterator outlives training (kept by the traceback of a pre-emption or
    an error) has not stopped its workers; they ignore SIGTERM (:func:`ignore_job_signals`),
    so that wait would never end. Registered as a ``multiprocessing`` finalizer of
    priority 0, which runs before that wait both at interpreter exit and at the end of a
    process started by ``multiprocessing`` (Detectron2's ``launch``)."""
    multiprocessing.util.Finalize(None, _kill_loader_workers, exitpriority=0)


def _kill_loader_workers() -> None:
    for child in multiprocessing.active_children():
        if child.daemon and _is_loader_worker(child.pid):
            child.kill()
            child.join()


def _is_loader_worker(pid: int) -> bool:
    """Whether process ``pid`` is a PyTorch loader worker (which names itself
    ``pt_data_worker``); where ``/proc`` is absent, every daemonic child is taken for one
    (``multiprocessing`` would end it at exit anyway)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "pt_data_worker"
    except FileNotFoundError:
        return not os.path.isdir("/proc")
