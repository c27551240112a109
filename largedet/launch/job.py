"""A training job's start: the check before any process starts, the output folder owned by
the run, then the processes (:func:`check_and_launch`, what the training scripts' ``main``
runs)."""

from __future__ import annotations

import argparse
import errno
import functools
import os
import socket
import sys
import time
from urllib.parse import urlparse
from collections.abc import Callable
from datetime import timedelta

from detectron2.config import get_cfg
from detectron2.utils import comm

from ..config import add_largedet_config
from ..config.errors import ConfigError, error_lines
from .elastic import record_torchrun_job, torchrun_job_id, torchrun_resume_reason
from .processes import (
    dist_url,
    exit_on_stop_signals,
    launch,
    launched_by_torchrun,
    launched_per_process,
    planned_world_size,
    process_flags_given,
    signalled_exit_wins,
    slurm_task_environment,
)
from .run_lock import OutputDirInUseError, OutputDirLock, claim_for_fresh_run

__all__ = ["OTHER_PROCESSES_WAIT_S", "check_and_launch"]


#: seconds a process other than the job's first waits, after its check before launch failed,
#: for the first one to print the error and exit (the launcher then stops the others)
OTHER_PROCESSES_WAIT_S = 60.0


def check_and_launch(
    main_func: Callable[[argparse.Namespace], object],
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], object],
    errors: tuple[type[Exception], ...] | None = None,
    output_dir: Callable[[argparse.Namespace], str] | None = None,
    timeout_s: Callable[[argparse.Namespace], float] | None = None,
) -> None:
    """``check(args)``, then :func:`launch`. An error of ``errors`` (default
    :class:`largedet.config.validate.ConfigError`) from ``check`` is one line on stderr
    (``error: ...``) and exit status 2, before any process group or training starts; under
    torchrun every process exits so and the first one alone prints the line. Under
    torchrun, process flags given on the command line (``--num-gpus``, ``--num-machines``,
    ``--machine-rank``, ``--dist-url``, set to other than their defaults, abbreviations
    included) are named as ignored, once. With ``output_dir`` (the run's ``OUTPUT_DIR`` of
    ``args``), the first process of the job owns that folder for the run
    (:class:`~largedet.launch.run_lock.OutputDirLock`): a folder that a live run owns is
    the same one line and exit status 2, and so is a fresh training run (no ``--resume``)
    on a folder that holds a previous run's checkpoints or metrics, unless ``--overwrite``
    moves them aside (:func:`~largedet.launch.run_lock.claim_for_fresh_run`). Nothing has
    built a model yet.

    ``timeout_s`` (the run's ``DISTRIBUTED.TIMEOUT_S`` of ``args``; default: the key's
    default) is the process group's timeout. Under torchrun, a worker of a restarted job
    continues the run of ``OUTPUT_DIR`` as with ``--resume``
    (:func:`~largedet.launch.elastic.torchrun_resume_reason`: a restart after a failure, or
    the folder's run being this job's, as after a restart that admits a machine): the
    first process decides, names why in one line, and every process follows it; a lock
    still held by the job's last round is waited for up to twice the timeout."""
    exit_on_stop_signals()  # a stop signal from here on exits 75, in one line
    with signalled_exit_wins():
        _check_and_launch(main_func, args, check, errors, output_dir, timeout_s)


def _check_and_launch(main_func, args, check, errors, output_dir, timeout_s) -> None:
    """:func:`check_and_launch` once its stop signals are set."""
    if getattr(args, "launcher", None) == "slurm":  # one Slurm task: env:// from Slurm's variables
        os.environ.update(slurm_task_environment(os.environ))
    first = not launched_per_process(args) or os.environ.get("RANK", "0") == "0"
    if launched_by_torchrun() and first:
        given = process_flags_given(args)
        if given:
            print(
                f"warning: {', '.join(given)} ignored under torchrun: the job has its "
                f"{os.environ['WORLD_SIZE']} processes ({os.environ['LOCAL_WORLD_SIZE']} on "
                "this machine, torchrun's --nproc_per_node and --nnodes)",
                file=sys.stderr,
            )
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0 and torchrun_job_id() is None:
            print(
                "warning: torchrun job without --rdzv-id: a restart that admits a machine starts "
                "the run afresh; give each job its own --rdzv-id",
                file=sys.stderr,
            )
    lock = None
    timeout = None
    try:
        check(args)
        _check_dist_url(args)
        timeout = timeout_s(args) if timeout_s is not None else _default_timeout_s()
        if output_dir is not None and first and (launched_per_process(args) or args.machine_rank == 0):
            directory = output_dir(args)
            lock = OutputDirLock(directory).acquire(same_job_wait_s=2 * timeout)
            reason = torchrun_resume_reason(directory) if launched_by_torchrun() else None
            if reason and not (args.eval_only or args.resume):
                args.resume = True
                print(f"{reason}: resuming from the newest complete checkpoint of {directory}",
                      file=sys.stderr)  # fmt: skip
            if launched_by_torchrun() and not args.eval_only:
                record_torchrun_job(directory)
            if not (args.eval_only or args.resume):  # a fresh run never writes over another's
                aside = claim_for_fresh_run(directory, getattr(args, "overwrite", False))
                if aside:
                    print(f"--overwrite: the previous run's files of {directory} moved to {aside}",
                          file=sys.stderr)  # fmt: skip
    except (OutputDirInUseError, *(errors or (ConfigError,))) as e:
        if first:
            for line in error_lines(e):  # one line per error of the config
                print(f"error: {line}", file=sys.stderr)
        else:
            # torchrun (and srun) stop every process as soon as one exits: the first
            # process, still checking, would be stopped before its line. It exits 2 once it
            # has printed, and the launcher stops this one then.
            time.sleep(OTHER_PROCESSES_WAIT_S)
        sys.exit(2)
    if launched_by_torchrun() and not args.eval_only:
        main_func = functools.partial(_resume_as_the_first_process, main_func)
    try:
        launch(main_func, args, timeout=timedelta(seconds=timeout))
    finally:
        if lock is not None:
            lock.release()


def _check_dist_url(args: argparse.Namespace) -> None:
    """An explicit ``--dist-url tcp://HOST:PORT`` that machine 0 will listen on must be free
    there: :class:`ConfigError` naming it where the port is taken on this machine (a host
    that is not this machine's is not checked; ``auto`` picks a free port)."""
    if launched_per_process(args) or planned_world_size(args) < 2 or args.machine_rank != 0:
        return
    url = dist_url(args)  # Detectron2's default on one machine: a free port, "auto"
    if not url.startswith("tcp://"):
        return
    parsed = urlparse(url)
    try:
        address = (parsed.hostname, parsed.port)
    except ValueError:
        raise ConfigError(f"--dist-url {url}: not tcp://HOST:PORT") from None
    if address[1] is None:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # another machine's address, or one that does not resolve here
            raise ConfigError(
                f"--dist-url {url}: port {address[1]} is in use on this machine (another run, or "
                "a process that still holds it); give another port, or leave --dist-url out on "
                "one machine (a free port is picked)"
            ) from None


def _default_timeout_s() -> float:
    """``DISTRIBUTED.TIMEOUT_S``'s declared default (a script that reads no config)."""
    return float(add_largedet_config(get_cfg()).DISTRIBUTED.TIMEOUT_S)


def _resume_as_the_first_process(main_func: Callable[[argparse.Namespace], object], args) -> object:
    """``main_func(args)`` with ``args.resume`` as the job's first process decided it
    (:func:`check_and_launch`), so that every process loads the same checkpoint."""
    args.resume = comm.all_gather(bool(args.resume))[0]
    return main_func(args)
