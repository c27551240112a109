"""A wall-clock limit for a benchmark's measuring part, so that a run on a lent machine ends
with the figures it has instead of being killed without them: the limit of
``benchmarks/trainer_overhead.py`` and ``benchmarks/loader_speed.py`` (``--max-seconds``).
Benchmark code, not part of the library."""

from __future__ import annotations

import math
import signal
import time

__all__ = ["TimeGuard", "TimeUp"]


class TimeUp(BaseException):
    """The time is up. A ``BaseException``, as ``KeyboardInterrupt`` is, so that code that
    catches ``Exception`` lets it through."""


class TimeGuard:
    """Raises ``TimeUp`` in the main thread ``seconds`` + ``grace`` after it was made,
    inside the ``with`` block, and suppresses it there (``expired`` tells).

    The limit is ``SIGALRM`` (``setitimer``, Unix): it interrupts a step that would not end,
    a loader that waits for a worker included. Where the exception is swallowed (raised in a
    ``__del__``, say), it is raised again every second until the block ends. Outside the
    block (and with ``seconds`` 0: no limit) nothing is raised: the timer is off and the
    handler that was there before is back. A loop that checks ``left``
    between steps stops at the end itself, keeping the step under way; ``grace`` lets it.

    Args:
        seconds: the end, counted from now; 0 or less: no limit.
        grace: seconds after the end at which ``TimeUp`` is raised.
    """

    def __init__(self, seconds: float, grace: float = 0.0):
        self.start = time.monotonic()
        self.end = self.start + seconds if seconds > 0 else math.inf
        self.grace = grace
        self.expired = False
        self._active = False
        self._previous = None

    def left(self) -> float:
        """Seconds until the end (``inf`` without a limit; negative past it)."""
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _fire(self, signum, frame) -> None:
        if self._active:
            self.expired = True
            raise TimeUp

    def __enter__(self) -> "TimeGuard":
        if math.isfinite(self.end):
            self._active = True
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, max(self.left() + self.grace, 1e-3), 1.0)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._active = False
        if math.isfinite(self.end):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
        return exc_type is not None and issubclass(exc_type, TimeUp)
