"""Pieces the video speed benchmarks share (``shift_cost.py``, ``multigrid_speed.py``): their
``--max-seconds`` alarm, the device sync around timed steps and the AMP modes. Benchmark
code, not part of the package."""

import random
import signal
import time
from typing import Tuple

import torch

#: ``--amp`` values -> autocast dtype (None: full precision)
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16}


class TimeUp(Exception):
    """The run reached ``--max-seconds``."""


#: set by the alarm: an exception raised after it (TimeUp, or TimeUp wrapped by a
#: library, such as Dynamo's BackendCompilerFailed) ends the measurements
ALARM = {"rang": False}


def _time_up(signum, frame):
    ALARM["rang"] = True
    raise TimeUp()


def set_alarm(seconds: float) -> None:
    """Raise ``TimeUp`` in the main thread ``seconds`` from now (and set ``ALARM``)."""
    signal.signal(signal.SIGALRM, _time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def start_run(args) -> Tuple[float, float, str]:
    """A speed run's start: the alarm at ``args.max_seconds``, ``args.threads`` torch
    threads on the CPU, Python's random seed 0. Returns (start time, deadline) in
    ``time.perf_counter`` seconds and the device's name."""
    t0 = time.perf_counter()
    set_alarm(args.max_seconds)
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name()
    else:
        torch.set_num_threads(args.threads)
        name = f"CPU, {torch.get_num_threads()} thread(s)"
    random.seed(0)
    return t0, t0 + args.max_seconds, name
