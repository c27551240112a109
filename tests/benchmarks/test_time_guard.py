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
    assert guard.expired and 0.2 <= time.monotonic() - start < 2.0
    assert guard.left() < 0


def test_a_swallowed_alarm_rings_again():
    """The first alarm is held back (blocked) until ``__del__`` runs, so it rings there on
    any machine, however busy: Python ignores an exception raised in ``__del__``; the next
    alarm, a second later, rings in the loop."""

    class SwallowsOnDelete:
        def __del__(self):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})  # the alarm rings here
            time.sleep(0.5)

    caught = []
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        with TimeGuard(0.1) as guard:
            try:
                while signal.SIGALRM not in signal.sigpending():
                    time.sleep(0.01)
                SwallowsOnDelete()  # dropped at once: __del__ runs now
                gc.collect()
                caught.append("not yet")
                for _ in range(500):  # the second alarm comes a second after the first
                    time.sleep(0.01)
            except TimeUp:
                caught.append("TimeUp")
                raise
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    assert guard.expired and caught == ["not yet", "TimeUp"]


def test_in_time_nothing_is_raised():
    with TimeGuard(5.0, grace=1.0) as guard:
        time.sleep(0.05)
    assert not guard.expired and 4.0 < guard.left() <= 5.0
    time.sleep(0.05)  # the alarm is off after the block
    with TimeGuard(0) as unlimited:
        assert unlimited.left() == float("inf")
    assert not unlimited.expired
