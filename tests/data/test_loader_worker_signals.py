"""Loader workers and the job's signals: a worker ignores what a cluster or Ctrl-C sends the
whole process group (the main process handles it), and a process whose loader outlived
training still exits."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from largedet.data.build import WorkerSafeDataLoader, loader_worker_init
from largedet.data.workers import job_signals_held


class Pids(IterableDataset):
    """Batches of the id of the worker process that made them."""

    def __iter__(self):
        while True:
            yield torch.tensor([os.getpid()])


def test_a_worker_outlives_the_job_signals_and_keeps_loading():
    init = functools.partial(loader_worker_init, signals=("SIGUSR1", "SIGUSR2"))  # PREEMPTION.SIGNALS
    loader = DataLoader(Pids(), batch_size=None, num_workers=1, worker_init_fn=init)
    batches = iter(loader)
    worker = int(next(batches))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        os.kill(worker, sig)
    # a killed worker would make the next batches raise "DataLoader worker ... is killed by signal"
    assert {int(next(batches)) for _ in range(20)} == {worker}
    del batches


def test_signals_held_in_a_block_arrive_as_it_ends():
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: got.append("SIGUSR1"))
    try:
        with job_signals_held(["SIGUSR1"]):
            # to this thread (one to the process may go to another thread of it)
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            assert got == []
        assert got == ["SIGUSR1"]
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("safe", [True, False], ids=["held", "plain DataLoader"])
def test_workers_hit_by_a_signal_as_they_start_live_on(safe):
    # Spawned workers import torch before their worker_init_fn runs: seconds in which they
    # still have SIGTERM's default action, unless they started with the signal held.
    init = functools.partial(loader_worker_init, signals=("SIGUSR1",))
    cls = WorkerSafeDataLoader if safe else DataLoader
    loader = cls(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=init,
                 multiprocessing_context="spawn")  # fmt: skip
    batches = iter(loader)

    def hit_and_load(workers):
        for worker in workers:
            os.kill(worker.pid, signal.SIGTERM)
        return [b.tolist() for b in batches]

    try:
        if safe:
            assert hit_and_load(batches._workers) == [[0, 1], [2, 3], [4, 5], [6, 7]]
        else:
            # PyTorch's SIGCHLD handler raises wherever the main process is when it learns:
            # one worker hit, so that it raises once, inside the block
            with pytest.raises(RuntimeError, match="DataLoader worker .* (exited unexpectedly|killed by signal)"):
                hit_and_load(batches._workers[:1])
                time.sleep(30)
    finally:
        del batches


EXITS = textwrap.dedent("""
    import sys
    from torch.utils.data import DataLoader
    from test_loader_worker_signals import Pids
    from largedet.data.build import end_loader_workers_at_exit, loader_worker_init

    end_loader_workers_at_exit()
    KEPT = iter(DataLoader(Pids(), batch_size=None, num_workers=2, worker_init_fn=loader_worker_init))
    next(KEPT)
    sys.exit(75)  # as a pre-empted process does, its loader's iterator still alive
""")


def test_a_process_whose_loader_outlives_training_exits():
    """multiprocessing ends daemonic children at exit with SIGTERM, which the workers ignore;
    they are killed first, and the process exits with its status."""
    done = subprocess.run([sys.executable, "-c", EXITS], cwd=os.path.dirname(__file__),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 75, done.stderr[-3000:]
