"""The writers of a run: the console's ETA under a batch ramp, Weights & Biases, and
Detectron2's file writers that stop the run in one line on a full disk
(:mod:`largedet.launch.full_disk`, re-exported here).

Detectron2's :class:`~detectron2.utils.events.CommonMetricPrinter` estimates the time left
as the median step time times the steps left. Under ``SOLVER.BATCH_RAMP`` the early steps
are smaller than the later ones (256 images against 1024), so that estimate is short by
the ratio of the batches until the ramp ends. :class:`ImageClockPrinter` measures the time
per image instead, the median over the same window of each step's time over its global
batch, and multiplies it by the images left; it puts that estimate into the event storage
as ``eta_seconds`` (as Detectron2's does). Everything else it prints is Detectron2's.

Weights & Biases, beside ``metrics.json`` and TensorBoard: :class:`WandbWriter` logs what
Detectron2's ``JSONWriter`` writes to ``metrics.json``: every scalar of the event storage
(losses, ``lr``, ``time``, ``data_time``, evaluation results, ``agvm/...``), median-smoothed
over the last ``window_size`` values where the scalar asks for it, with the iteration as
W&B's step. It runs where the other writers run (Detectron2's ``PeriodicWriter``, every
``LOG_PERIOD`` steps, on the main process only). ``wandb`` is imported only when a writer
is built, so it stays an optional dependency. Switched on by ``WANDB.ENABLED`` (see
:func:`largedet.config.add_largedet_config`)::

    def build_writers(self):
        return default_writers(self.cfg.OUTPUT_DIR, self.max_iter) + build_wandb_writers(self.cfg)
"""

from __future__ import annotations

import datetime
import logging
import os
import statistics
from collections import defaultdict
from typing import Dict, List, Optional

import yaml
from detectron2.engine.hooks import PeriodicWriter
from detectron2.utils.events import CommonMetricPrinter, EventWriter, get_event_storage
from detectron2.utils.file_io import PathManager

from ..launch.full_disk import (
    StopOnFullDiskJSONWriter,
    StopOnFullDiskTensorboardXWriter,
    raise_if_a_log_found_no_space,
    set_up_log_files,
    stop_log_files_on_full_disk,
)
from ..solver.batch import BatchSchedule

__all__ = [
    "EarlyPeriodicWriter",
    "ImageClockPrinter",
    "WandbWriter",
    "build_wandb_writers",
    "StopOnFullDiskJSONWriter",
    "StopOnFullDiskTensorboardXWriter",
    "default_writers_stopping_on_full_disk",
    "drop_logged_steps",
    "raise_if_a_log_found_no_space",
    "set_up_log_files",
    "stop_log_files_on_full_disk",
]

logger = logging.getLogger(__name__)

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


# a file writer that finds no space ends the run in one line: largedet.launch.full_disk


def default_writers_stopping_on_full_disk(output_dir: str, max_iter: int) -> list:
    """Detectron2's ``default_writers`` (console, ``metrics.json``, TensorBoard), the file
    writers :class:`StopOnFullDiskJSONWriter` and :class:`StopOnFullDiskTensorboardXWriter`."""
    PathManager.mkdirs(output_dir)
    return [
        CommonMetricPrinter(max_iter),
        StopOnFullDiskJSONWriter(os.path.join(output_dir, "metrics.json")),
        StopOnFullDiskTensorboardXWriter(output_dir),
    ]


def forget_steps_from(storage, hooks, iteration: int) -> None:
    """After a rollback the steps from ``iteration`` on are trained again: the records
    they left are undone so that each is logged once, with the values of the step that
    stands. Their records leave ``metrics.json`` (:func:`drop_logged_steps`), the event
    storage's history (the windows the writers smooth over, the console's median included,
    hold only steps that stand: an undone NaN does not linger in them) and its latest
    values, and the file writers' mark of the last step written (Detectron2's
    ``_last_write``) goes back, so the redone steps are written again. TensorBoard keeps
    the undone steps' events (its file cannot be cut while it is written)."""
    drop_logged_steps(hooks, iteration)
    history = storage._history  # Detectron2's EventStorage: name -> HistoryBuffer
    for name in list(history):
        old = history[name]
        kept = [(value, step) for value, step in old.values() if step < iteration]
        if not kept:
            del history[name]
            storage._latest_scalars.pop(name, None)
            continue
        fresh = type(old)(old._max_length)
        for value, step in kept:
            fresh.update(value, step)
        history[name] = fresh
        if name in storage._latest_scalars:
            storage._latest_scalars[name] = kept[-1]
    for hook in hooks:
        for writer in getattr(hook, "_writers", ()):  # Detectron2's PeriodicWriter
            if isinstance(getattr(writer, "_last_write", None), int):
                writer._last_write = min(writer._last_write, iteration - 1)


def drop_logged_steps(hooks, iteration: int) -> None:
    """Drop the records of the steps from ``iteration`` on from the file writers of
    ``hooks`` (Detectron2's ``PeriodicWriter``): a resumed run trains them again and logs them
    once."""
    for hook in hooks:
        for writer in getattr(hook, "_writers", ()):  # Detectron2's PeriodicWriter
            if isinstance(writer, (StopOnFullDiskJSONWriter, StopOnFullDiskTensorboardXWriter)):
                dropped = writer.drop_records_from(iteration)
                if dropped:
                    logger.info("metrics.json: dropped %d record(s) of the steps from %d on, which "
                                "this run trains again", dropped, iteration)  # fmt: skip


class WandbWriter(EventWriter):
    """Logs the event storage's latest scalars to one W&B run."""

    def __init__(self, *, project: str, name: str = "", entity: str = "", mode: str = "", log_dir: str = "",
                 config: Optional[Dict] = None, window_size: int = 20):  # fmt: skip
        """
        Args:
            project: W&B project.
            name: run name ("": W&B picks one).
            entity: W&B team or user ("": the account's default).
            mode: ``wandb.init``'s mode, "online", "offline" or "disabled"; "" leaves
                it to wandb ($WANDB_MODE, else online).
            log_dir: folder under which wandb writes the run's files (its ``wandb/``
                folder); "": wandb's default ($WANDB_DIR, else the working directory).
            config: the run's configuration, as plain nested dicts (shown in W&B).
            window_size: median-smoothing window of scalars with a smoothing hint,
                as for ``metrics.json``.
        """
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "WANDB.ENABLED is true but the wandb package is not installed: "
                "pip install wandb, or set WANDB.ENABLED False"
            ) from e
        kwargs = {"project": project, "config": config or {}}
        for key, value in (("name", name), ("entity", entity), ("mode", mode), ("dir", log_dir)):
            if value:
                kwargs[key] = value
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self._run = wandb.init(**kwargs)
        self._window_size = window_size
        self._last_write = -1
        logger.info(
            "Logging to W&B: project %s, run %s, mode %s, files in %s",
            project,
            self._run.name,
            self._run.settings.mode,
            self._run.dir,
        )

    @property
    def run(self):
        """The ``wandb`` run this writer logs to."""
        return self._run

    def write(self):
        storage = get_event_storage()
        by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
        for key, (value, iteration) in storage.latest_with_smoothing_hint(
            self._window_size
        ).items():
            if iteration > self._last_write:
                by_iter[iteration][key] = value
        # W&B's step must grow: log the iterations in order, each one once.
        for iteration in sorted(by_iter):
            self._run.log(by_iter[iteration], step=iteration)
            self._last_write = iteration

    def close(self):
        self._run.finish()


def build_wandb_writers(cfg) -> List[EventWriter]:
    """``[WandbWriter]`` set up from ``cfg.WANDB`` (the whole config logged as the run's
    config, its files under ``OUTPUT_DIR``), or ``[]`` when ``WANDB.ENABLED`` is false."""
    c = cfg.WANDB
    if not c.ENABLED:
        return []
    return [
        WandbWriter(
            project=c.PROJECT,
            name=c.NAME or os.path.basename(os.path.normpath(cfg.OUTPUT_DIR)),
            entity=c.ENTITY,
            mode=c.MODE,
            log_dir=cfg.OUTPUT_DIR,
            config=yaml.safe_load(cfg.dump()),
        )
    ]


class EarlyPeriodicWriter(PeriodicWriter):
    """Detectron2's ``PeriodicWriter`` whose console printers also print after an invocation's third
    step (its first timed one): a run's progress and ETA early; the file writers keep their steps."""

    def after_step(self):
        super().after_step()
        it = self.trainer.iter
        if it == self.trainer.start_iter + 2 and (it + 1) % self._period and it != self.trainer.max_iter - 1:
            for writer in self._writers:
                if isinstance(writer, CommonMetricPrinter):
                    writer.write()
