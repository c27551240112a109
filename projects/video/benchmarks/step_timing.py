"""Pieces the video speed benchmarks share (``shift_cost.py``, ``multigrid_speed.py``): their
``--max-seconds`` alarm, the device sync around timed steps and the AMP modes. Benchmark
code, not part of the package."""

import signal

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
    """Raise :class:`TimeUp` in the main thread ``seconds`` from now (and set ``ALARM``)."""
    signal.signal(signal.SIGALRM, _time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
