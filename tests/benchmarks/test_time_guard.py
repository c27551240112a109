"""benchmarks/time_guard.py: the limit stops a loop that would not end, also where the first
alarm is swallowed, and lets a loop that ends in time run to its end."""

import gc
import signal
import time

from time_guard import TimeGuard, TimeUp


def test_the_limit_stops_a_loop_that_would_not_end():
    start = time.monotonic()
    with TimeGuard(0.2) as guard:
        for _ in range(500):  # 5 s at most: a failure, not a hang
            time.sleep(0.01)
    # the loop alone takes 5 s or more: the bound tells the limit's stop from its end
    assert guard.expired and 0.2 <= time.monotonic() - start < 4.5
    assert guard.left() < 0


def test_a_swallowed_alarm_rings_again():
    """An alarm that rings inside ``__del__`` (where Python ignores the exception) is raised
    again by the next one. The first ring is the guard's own handler reached through
    ``signal.raise_signal`` in ``__del__`` (sent to this thread, so it is handled there on any
    machine, however busy, and whichever thread a process-wide alarm would reach); the
    guard's timer then rings in the loop."""

    class SwallowsOnDelete:
        def __del__(self):
            signal.raise_signal(signal.SIGALRM)  # rings here: the TimeUp is ignored
            time.sleep(0.1)

    caught = []
    with TimeGuard(3.0) as guard:
        try:
            SwallowsOnDelete()  # dropped at once: __del__ runs now
            gc.collect()
            caught.append("not yet" if guard.expired else "no ring in __del__")
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:  # the timer rings 3 s after the start
                time.sleep(0.01)
        except TimeUp:
            caught.append("TimeUp")
            raise
    assert guard.expired and caught == ["not yet", "TimeUp"]


def test_in_time_nothing_is_raised_and_the_alarm_is_put_back():
    def earlier(signum, frame):
        pass

    before = signal.signal(signal.SIGALRM, earlier)
    try:
        with TimeGuard(60.0, grace=1.0) as guard:
            assert 59.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 61.0
            time.sleep(0.05)
        assert not guard.expired and 30.0 < guard.left() <= 60.0
        # after the block: no timer left running, and the handler that was there is back
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is earlier
    finally:
        signal.signal(signal.SIGALRM, before)
    with TimeGuard(0) as unlimited:
        assert unlimited.left() == float("inf")
    assert not unlimited.expired
