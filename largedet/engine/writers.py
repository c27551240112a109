"""The console writer of a run whose steps differ in size (a batch ramp).

Detectron2's :class:`~detectron2.utils.events.CommonMetricPrinter` estimates the time left
as the median step time times the steps left. Under ``SOLVER.BATCH_RAMP`` the early steps
are smaller than the later ones (256 images against 1024), so that estimate is short by
the ratio of the batches until the ramp ends. :class:`ImageClockPrinter` measures the time
per image instead, the median over the same window of each step's time over its global
batch, and multiplies it by the images left; it puts that estimate into the event storage
as ``eta_seconds`` (as Detectron2's does). Everything else it prints is Detectron2's.
"""

from __future__ import annotations

import datetime
import statistics
from typing import Optional

from detectron2.utils.events import CommonMetricPrinter

from ..solver.batch import BatchSchedule

__all__ = ["ImageClockPrinter"]

# the steps of the median (Detectron2's printer takes the last 1000)
ETA_WINDOW = 1000


class ImageClockPrinter(CommonMetricPrinter):
    """:class:`CommonMetricPrinter` whose ETA is time per image x images left, the images
    of each step taken from ``schedule`` (:class:`largedet.solver.batch.BatchSchedule`)."""

    def __init__(self, schedule: BatchSchedule, window_size: int = 20):
        super().__init__(schedule.total_steps, window_size=window_size)
        self._schedule = schedule

    def eta_seconds(self, iteration: int, step_times) -> float:
        """Seconds left after step ``iteration`` (0-based) has run, from ``step_times``:
        the list of (seconds, step) pairs of the steps timed so far (``HistoryBuffer.values()``)."""
        recent = step_times[-ETA_WINDOW:]
        per_image = statistics.median(t / self._schedule.batch_at(step) for t, step in recent)
        end = self._schedule.total_steps
        left = self._schedule.images_before(end) - self._schedule.images_before(min(iteration + 1, end))
        return per_image * left

    def _get_eta(self, storage) -> Optional[str]:
        try:
            history = storage.history("time")
        except KeyError:  # no step timed yet: Detectron2's own estimate
            return super()._get_eta(storage)
        eta = self.eta_seconds(storage.iter, history.values())
        storage.put_scalar("eta_seconds", eta, smoothing_hint=False)
        return str(datetime.timedelta(seconds=int(eta)))
