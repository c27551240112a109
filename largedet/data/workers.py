"""The loaders' worker processes start safely (:func:`start_workers`): with the job's signals
held until their ``worker_init_fn`` ignores them (:func:`job_signals_held`,
:func:`loader_worker_init`), and, where they are forked, without OpenCV's running thread pool
(:func:`opencv_pool_stopped`); workers that a signal left behind are ended when the main
process exits (:func:`end_loader_workers_at_exit`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import sys
from typing import Callable, Iterator, Sequence, Tuple

from detectron2.config import CfgNode
from detectron2.data.build import worker_init_reset_seed
from torch.utils.data import DataLoader

__all__ = [
    "JOB_SIGNALS",
    "WorkerSafeDataLoader",
    "end_loader_workers_at_exit",
    "ignore_job_signals",
    "job_signals_held",
    "loader_worker_init",
    "opencv_pool_stopped",
    "start_workers",
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
    signals = [signal.Signals[name] for name in dict.fromkeys((*JOB_SIGNALS, *names))]
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)
    # held while the worker started (job_signals_held): what arrived then is dropped now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


@contextlib.contextmanager
def job_signals_held(names: Sequence[str] = ()) -> Iterator[None]:
    """Within the block this thread holds :data:`JOB_SIGNALS` and ``names`` (blocked, not
    lost: it gets them as the block ends; one sent to the process may be taken by another of
    its threads meanwhile, and Python runs the handler as usual). Loader workers started inside inherit
    the block, through ``fork`` and through the ``exec`` of a spawned worker, and hold the
    signals until :func:`ignore_job_signals`, at the start of their ``worker_init_fn``,
    ignores them. Without it a signal to the job's process group while the workers start
    (as training or an evaluation begins) kills them with the default action before they
    can ignore it, and the run ends in PyTorch's ``DataLoader worker ... exited
    unexpectedly`` instead of its pre-emption checkpoint."""
    held = [signal.Signals[name] for name in dict.fromkeys((*JOB_SIGNALS, *names))]
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_signals(loader: DataLoader) -> Tuple[str, ...]:
    """The signals ``loader``'s ``worker_init_fn`` ignores beside :data:`JOB_SIGNALS` (the
    ``signals`` of a :func:`loader_worker_init` partial)."""
    return tuple(getattr(loader.worker_init_fn, "keywords", {}).get("signals", ()))


def start_workers(loader: DataLoader, make_iterator: Callable = iter) -> Iterator:
    """``make_iterator(loader)`` (``iter``), its workers (if it has any) started with the
    job's signals held (:func:`job_signals_held`; workers of a ``forkserver`` context are
    the fork server's children and do not inherit the block) and, where they are forked,
    with OpenCV's thread pool stopped (:func:`opencv_pool_stopped`)."""
    if loader.num_workers == 0:
        return make_iterator(loader)
    forked = _uses_fork(loader)
    if not forked:
        # multiprocessing starts its resource tracker with the first spawned process, and
        # unblocks SIGINT and SIGTERM after it: started first, it leaves the block alone
        multiprocessing.resource_tracker.ensure_running()
    pool = opencv_pool_stopped() if forked else contextlib.nullcontext()
    with pool, job_signals_held(worker_signals(loader)):
        return make_iterator(loader)


class WorkerSafeDataLoader(DataLoader):
    """PyTorch's ``DataLoader`` whose workers start safely (:func:`start_workers`):
    largedet's training loaders and the video project's."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        return start_workers(self, DataLoader.__iter__)


def _uses_fork(loader: DataLoader) -> bool:
    context = loader.multiprocessing_context or multiprocessing.get_context()
    return context.get_start_method() == "fork"


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


@contextlib.contextmanager
def opencv_pool_stopped() -> Iterator[None]:
    """OpenCV's thread pool stopped for the duration (its thread count set to one, then back).

    A process forked while the pool's threads wait for work inherits the pool without its
    threads: the child's first ``cv2.setNumThreads`` or parallel OpenCV call then blocks for
    ever (or crashes) in the pool's teardown. Any parallel OpenCV call in the main process
    starts the pool (a bicubic ``cv2.resize`` of a photo-sized image does), so loader workers
    are forked inside this context. Nothing happens where OpenCV is not imported or its pool
    is already off."""
    cv2 = sys.modules.get("cv2")
    threads = cv2.getNumThreads() if cv2 is not None else 1
    if threads <= 1:
        yield
        return
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)

