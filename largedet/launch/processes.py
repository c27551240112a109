"""Starting one process per device, for every training script: Detectron2's ``launch``, or
``torchrun``::

    python tools/train_net.py --config CFG --num-gpus 8 \\
        [--num-machines N --machine-rank R --dist-url tcp://HOST:PORT]
    torchrun --nproc_per_node 8 tools/train_net.py --config CFG
    srun --ntasks-per-node 8 python tools/train_net.py --config CFG --launcher slurm

A script calls :func:`largedet.launch.job.check_and_launch`: its config is checked
for :func:`planned_world_size` processes before any process starts, so that a batch that
does not split over torchrun's processes is refused as it is for ``--num-gpus``. This
module depends on Detectron2, torch and three leaf modules (the full-disk error,
the pre-emption exit, :mod:`~largedet.launch.elastic`) only.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import functools
import gc
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import zlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Dict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import default_argument_parser
from detectron2.engine import launch as d2_launch
from detectron2.utils import comm

from ..checkpoint import DiskFullError, LaterCheckpointError, NoCompleteCheckpointError, WeightsUnavailableError
from .elastic import LOST_PROCESS_EXIT_CODE, is_lost_process
from .preemption import (
    CANCELLED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    Diverged,
    Preempted,
    exit_raised_from_handler,
    forget_exit_raised_from_handler,
    raise_from_handler,
)

__all__ = [
    "shut_down_distributed_at_exit",
    "dist_url",
    "exit_on_stop_signals",
    "signalled_exit_wins",
    "first_host",
    "launch",
    "launched_by_torchrun",
    "launched_per_process",
    "planned_world_size",
    "process_flags_given",
    "shut_down_distributed",
    "slurm_task_environment",
]

#: the flags that say how many processes to start; torchrun has started them already
_PROCESS_FLAGS = ("--num-gpus", "--num-machines", "--machine-rank", "--dist-url")


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (torch.distributed.run)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


def launched_per_process(args: argparse.Namespace) -> bool:
    """Whether every process of the job was started already, with torch.distributed's
    ``env://`` variables set: by ``torchrun``, or as one Slurm task each (``--launcher
    slurm``, the variables set from Slurm's by :func:`slurm_task_environment`)."""
    return launched_by_torchrun() or getattr(args, "launcher", None) == "slurm"


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (``SLURM_JOB_NODELIST``): ``node[07-09,12],gpu3``
    is ``node07``, ``rack[1-2]-n[01-04]`` is ``rack1-n01``."""
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if c == "," and depth == 0:
            end = i
            break
    # each bracket's first entry: "07-09,12" -> "07"
    return re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", nodelist[:end])


def _tasks_on_node(tasks_per_node: str, node: int) -> int:
    """The entry of ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) for node ``node``."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[node]


def slurm_task_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """torch.distributed's ``env://`` variables for a process that is one Slurm task (a task
    of ``srun``), from the variables Slurm sets: ``RANK`` = ``SLURM_PROCID``, ``LOCAL_RANK``
    = ``SLURM_LOCALID``, ``WORLD_SIZE`` = ``SLURM_NTASKS``, ``LOCAL_WORLD_SIZE`` = the tasks
    on this node (``SLURM_NTASKS_PER_NODE``, or this node's entry of
    ``SLURM_TASKS_PER_NODE``), ``MASTER_ADDR`` = the first host of ``SLURM_JOB_NODELIST``
    and ``MASTER_PORT`` one in [10000, 30000) derived from ``SLURM_JOB_ID`` and
    ``SLURM_RESTART_COUNT`` (every task computes the same; a requeued run does not meet the
    last one's sockets). ``MASTER_ADDR`` and ``MASTER_PORT`` already set are kept."""
    local = environ.get("SLURM_NTASKS_PER_NODE")
    if local is None or not local.isdigit():
        local = str(_tasks_on_node(environ["SLURM_TASKS_PER_NODE"], int(environ.get("SLURM_NODEID", "0"))))
    restarts = int(environ.get("SLURM_RESTART_COUNT", "0"))
    port = 10000 + (zlib.crc32(environ["SLURM_JOB_ID"].encode()) + restarts) % 20000
    return {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": local,
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(environ["SLURM_JOB_NODELIST"]),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(port),
    }


def planned_world_size(args: argparse.Namespace) -> int:
    """The number of processes the job will have: torchrun's (or the Slurm tasks')
    ``WORLD_SIZE``, or ``--num-gpus`` x ``--num-machines``. Known before any process group
    exists."""
    if launched_per_process(args):
        return int(os.environ["WORLD_SIZE"])
    return args.num_gpus * args.num_machines


def process_flags_given(args: argparse.Namespace) -> list[str]:
    """The process flags whose parsed values differ from the command line's defaults
    (Detectron2's: largedet's parser adds none of them)."""
    defaults = default_argument_parser().parse_args([])
    return [
        flag
        for flag in _PROCESS_FLAGS
        if getattr(args, flag[2:].replace("-", "_"), None)
        != getattr(defaults, flag[2:].replace("-", "_"), None)
    ]


def launch(
    main_func: Callable[[argparse.Namespace], object],
    args: argparse.Namespace,
    timeout: timedelta = timedelta(minutes=30),
) -> None:
    """Run ``main_func(args)`` in every process of the job.

    Under ``torchrun``, and with ``--launcher slurm`` (each process a Slurm task, the
    environment set by :func:`slurm_task_environment`), the processes exist already: join
    the process group from the ``env://`` variables (NCCL on GPUs, gloo on the CPU), with
    Detectron2's per-machine group, and ignore ``--num-gpus`` and the machine flags. Otherwise use Detectron2's
    ``launch`` with ``args.num_gpus`` processes per machine (on a machine without GPUs,
    that many CPU processes on gloo) and ``--num-machines/--machine-rank/--dist-url`` for
    several machines.
    """
    if not launched_per_process(args):
        # one process: Detectron2 calls main_func here, without a process group of its own
        several = planned_world_size(args) > 1
        # Detectron2 starts a worker process whenever the job has several, even one per
        # machine (--num-gpus 1 --num-machines N)
        with _forwarding_signals(several):
            try:
                d2_launch(
                    _run_then_shut_down if several else _run_alone,
                    args.num_gpus,
                    num_machines=args.num_machines,
                    machine_rank=args.machine_rank,
                    dist_url=dist_url(args),
                    args=(main_func, args),
                    timeout=timeout,
                )
            except mp.ProcessExitedException as e:
                # the workers saved and exited, or one printed its one-line error
                if e.exit_code in (PREEMPTED_EXIT_CODE, CANCELLED_EXIT_CODE):
                    ignore_stop_signals_while_exiting()
                if e.exit_code in (PREEMPTED_EXIT_CODE, CANCELLED_EXIT_CODE, DISK_FULL_EXIT_CODE,
                                   LOST_PROCESS_EXIT_CODE, NO_CHECKPOINT_EXIT_CODE, DIVERGED_EXIT_CODE):
                    sys.exit(e.exit_code)
                if e.signal_name:  # killed from outside: one line, not a spawn traceback
                    why = " (the kernel's out-of-memory killer, or kill -9)" if e.signal_name == "SIGKILL" else ""
                    print(f"error: process {e.error_index} of the job (pid {e.error_pid}) was killed by "
                          f"{e.signal_name}{why}; the job's other processes were stopped; --resume "
                          "continues from the newest complete checkpoint", file=sys.stderr)  # fmt: skip
                    sys.exit(LOST_PROCESS_EXIT_CODE)
                raise
        return
    has_gpu = torch.cuda.is_available()
    if has_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    with _exit_on_lost_process():  # the job's other processes may be gone from the start
        dist.init_process_group("nccl" if has_gpu else "gloo", init_method="env://", timeout=timeout)
        comm.create_local_process_group(int(os.environ["LOCAL_WORLD_SIZE"]))
        comm.synchronize()
    _run_then_shut_down(main_func, args)


def dist_url(args: argparse.Namespace) -> str:
    """``--dist-url``; on one machine, left at Detectron2's default (a fixed port per user,
    which a second run at the same time would find taken), a free port of this machine."""
    default = default_argument_parser().get_default("dist_url")
    return "auto" if args.num_machines == 1 and args.dist_url == default else args.dist_url


#: exit status of a run stopped on a divergence (EX_DATAERR)
DIVERGED_EXIT_CODE = 65

#: exit status of a ``--resume`` that found checkpoints but none that loads, of weights at a URL
#: that cannot be fetched, and of a save refused over a checkpoint of a later iteration
#: (EX_NOINPUT)
NO_CHECKPOINT_EXIT_CODE = 66

#: exit status of a run that could not write a checkpoint for lack of space (EX_IOERR)
DISK_FULL_EXIT_CODE = 74


def _run_alone(main_func: Callable[[argparse.Namespace], object], args) -> None:
    """``main_func(args)`` in a one-process job, a full disk one line (:func:`_one_line`)."""
    exit_on_stop_signals()
    try:
        with signalled_exit_wins(), _one_line():
            main_func(args)
    except Preempted:
        ignore_stop_signals_while_exiting()
        raise


@contextlib.contextmanager
def _one_line():
    """A file that found no space (:class:`~largedet.checkpoint.atomic.DiskFullError`: a
    checkpoint, ``metrics.json``, ``log.txt``, TensorBoard's events, ``run_summary.json``)
    ends the process with its one line on stderr and :data:`DISK_FULL_EXIT_CODE`; a
    ``--resume`` that found checkpoints of which none loads
    (:class:`~largedet.checkpoint.NoCompleteCheckpointError`), weights that cannot be fetched
    and a save over a later checkpoint (:class:`~largedet.checkpoint.LaterCheckpointError`),
    with its one line and :data:`NO_CHECKPOINT_EXIT_CODE`."""
    try:
        yield
    except DiskFullError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(DISK_FULL_EXIT_CODE)
    except Diverged:  # the trainer logged its one line
        sys.exit(DIVERGED_EXIT_CODE)
    except (NoCompleteCheckpointError, WeightsUnavailableError, LaterCheckpointError) as e:
        # every process found the same (only the main one saves): the first says it
        if comm.get_rank() == 0:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(NO_CHECKPOINT_EXIT_CODE)
    except OSError as e:  # a write outside the trainer's (the config dump, the evaluation's)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: {e.filename or 'a file of the run'}: no space left on the device "
              f"({e.strerror})", file=sys.stderr)  # fmt: skip
        sys.exit(DISK_FULL_EXIT_CODE)


@contextlib.contextmanager
def _exit_on_lost_process():
    """A collective that failed because another process of the job was lost
    (:func:`~largedet.launch.elastic.is_lost_process`) ends this process with one line on
    stderr and :data:`~largedet.launch.elastic.LOST_PROCESS_EXIT_CODE`, on which torchrun's
    elastic agent restarts the job's workers. The process leaves at once, its logs flushed,
    without the interpreter's shutdown: its process groups, whose peer is gone, are not
    destroyed (that can wait on the peer), and tearing down torch and Detectron2 would
    delay the restart. Loader workers end with it (PyTorch's watchdog)."""
    try:
        yield
    except Exception as e:
        if not is_lost_process(e):
            raise
        if exit_raised_from_handler() is not None:  # the job is stopping on a signal: the
            raise  # peer left on it too (signalled_exit_wins gives the signal's status)
        what = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if len(what) > 300:
            what = what[:297] + "..."
        print(
            f"error: rank {comm.get_rank()}: a process of the job was lost ({what}); exiting "
            f"with {LOST_PROCESS_EXIT_CODE}: under torchrun's elastic agent the job restarts from "
            "the newest complete checkpoint",
            file=sys.stderr,
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(LOST_PROCESS_EXIT_CODE)


def _run_then_shut_down(main_func: Callable[[argparse.Namespace], object], args) -> None:
    """``main_func(args)`` in one process of the job, then, once every process got there,
    the process groups destroyed (without a process group, nothing to do): every script's
    workers end cleanly, evaluation-only runs included. A lost process of the job ends
    this one in one line (:func:`_exit_on_lost_process`); a stop signal before training
    exits :data:`PREEMPTED_EXIT_CODE` (:func:`exit_on_stop_signals`)."""
    exit_on_stop_signals()
    try:
        with signalled_exit_wins(), _exit_on_lost_process(), _one_line():
            main_func(args)
    except Preempted:  # every rank stopped at the same step, after the checkpoint
        ignore_stop_signals_while_exiting()
        comm.synchronize()
        shut_down_distributed()
        raise
    comm.synchronize()  # no process tears its groups down while another still uses them
    shut_down_distributed()


#: what a launching process passes on to the worker processes it started
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def _forwarding_signals(forward: bool):
    """Within the block (``forward`` true), :data:`FORWARDED_SIGNALS` received by this
    process are sent on to its worker processes (Detectron2's ``launch`` starts them with
    ``multiprocessing``), which save and exit on them (:mod:`largedet.launch.preemption`)."""
    if not forward or threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward_signal(signum, frame):
        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward_signal) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        if not _exiting_after_preemption:  # else the exit's handlers stay
            for sig, handler in previous.items():
                signal.signal(sig, handler)


_exiting_after_preemption = False


def exit_on_stop_signals() -> None:
    """Until the trainer's :class:`~largedet.launch.preemption.PreemptionHook` takes them
    over (and after it gives them back): a stop signal (:data:`FORWARDED_SIGNALS`) while a
    job starts (its check, its model, its resume) exits at once, in one line, with
    :data:`PREEMPTED_EXIT_CODE`: nothing is trained yet, nothing to save, and a cluster
    reads the status a stop signal gives, not 143 from the signal's default action or 69
    from a worker killed by it. A signal this process ignores (as a Slurm job's training
    ignores submitit's) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        print(f"{signal.Signals(signum).name} outside training (nothing to save): exiting "
              f"{PREEMPTED_EXIT_CODE}; --resume continues from the newest complete checkpoint",
              file=sys.stderr, flush=True)  # fmt: skip
        raise_from_handler(SystemExit(PREEMPTED_EXIT_CODE))

    for sig in FORWARDED_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # one the job ignores stays ignored
            signal.signal(sig, stop)


@contextlib.contextmanager
def signalled_exit_wins():
    """Within the block, once a signal handler has raised its exit into the code that ran
    (:func:`~largedet.launch.preemption.raise_from_handler`: a stop signal at start-up, one
    during the final evaluation), the process exits with that exit's status whatever
    exception leaves the block. Code whose clean-up fails on the state the exit interrupted
    it in (omegaconf restoring the flags of a half-built node) raises an error of its own
    in place of the exit: status 1 and a traceback, where a cluster reads 75."""
    forget_exit_raised_from_handler()
    try:
        yield
    except BaseException as e:
        pending = exit_raised_from_handler()
        if pending is None or e is pending:
            raise
        raise pending from None


def ignore_stop_signals_while_exiting() -> None:
    """After the pre-emption checkpoint, until the process has exited with
    :data:`PREEMPTED_EXIT_CODE`: a further stop signal (:data:`FORWARDED_SIGNALS`; a
    cluster's second SIGTERM, an impatient Ctrl-C) is logged and ignored, so that it cannot
    turn the exit status into 143 or 130 while the process groups shut down."""
    global _exiting_after_preemption
    if threading.current_thread() is not threading.main_thread():
        return
    _exiting_after_preemption = True

    def note(signum, frame):
        print(f"{signal.Signals(signum).name} ignored: the checkpoint is written, exiting "
              f"{PREEMPTED_EXIT_CODE}", file=sys.stderr, flush=True)  # fmt: skip

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, note)


def shut_down_distributed() -> None:
    """Destroy this process's process groups now, while the interpreter is fully alive.

    Detectron2's ``launch`` never destroys them, and its ``comm`` module keeps references
    (its local process group, its cached gloo group) that would keep them alive even
    after ``destroy_process_group``. Gloo's worker threads then run on into interpreter
    finalization; one that drops the last reference to a tensor of a collective at that
    moment must take the GIL, the finalizing interpreter ends the thread, and the process
    aborts (``terminate called without an active exception``, SIGABRT) after training
    finished. Here the groups are destroyed, Detectron2's references dropped and garbage
    collected, which joins gloo's threads (and the store's). A no-op outside
    ``torch.distributed``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()
    comm._LOCAL_PROCESS_GROUP = None
    comm._get_global_gloo_group.cache_clear()
    gc.collect()


@functools.lru_cache(maxsize=None)
def shut_down_distributed_at_exit() -> None:
    """Register :func:`shut_down_distributed` to run when the process exits, once per process
    (atexit handlers run before the interpreter starts to finalize)."""
    atexit.register(shut_down_distributed)
