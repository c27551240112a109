"""The writers of a run: the console's ETA under a batch ramp, and log files that stop the
run in one line on a full disk.

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

import contextlib
import datetime
import errno
import functools
import json
import logging
import os
import shutil
import statistics
import sys
import threading
from collections import defaultdict
from typing import Dict, List, Optional

import yaml
from detectron2.utils import comm
from detectron2.utils.events import (
    CommonMetricPrinter,
    EventWriter,
    JSONWriter,
    TensorboardXWriter,
    get_event_storage,
)
from detectron2.utils.file_io import PathManager
from detectron2.utils.logger import setup_logger

from ..checkpoint import DiskFullError, is_disk_full, last_checkpoint_state
from ..solver.batch import BatchSchedule

__all__ = [
    "ImageClockPrinter",
    "WandbWriter",
    "build_wandb_writers",
    "StopOnFullDiskJSONWriter",
    "StopOnFullDiskTensorboardXWriter",
    "default_writers_stopping_on_full_disk",
    "disk_full_error",
    "drop_metrics_records",
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


# --- a full disk at a log write ---------------------------------------------------------------
#
# Each file writer of a run (metrics.json, TensorBoard's events, log.txt) that finds no space
# ends the run the way a checkpoint does: one DiskFullError naming the file (its line printed
# by the launcher, exit status 74), instead of one traceback or "--- Logging error ---" block
# per write. The writer that failed is closed (its buffered bytes dropped) and writes no more.


def disk_full_error(path: str, output_dir: str) -> DiskFullError:
    """The one-line error of a log file ``path`` of the run in ``output_dir`` that found no space."""
    free = shutil.disk_usage(output_dir).free if os.path.isdir(output_dir) else 0
    error = DiskFullError(
        f"{path}: no space left on the device while writing the run's logs ({free} bytes free); "
        f"training stopped; {last_checkpoint_state(output_dir)}"
    )
    error.errno = errno.ENOSPC
    return error


class _StopsOnFullDisk:
    """A file writer's ``write`` and ``close`` that raise :class:`DiskFullError` (once) where
    the disk is full; after that the writer is closed and does nothing. A subclass names
    the file it writes (``_written_file``) and closes it (``_close_file``)."""

    _full = False  # set once the disk was found full

    def _written_file(self) -> str:
        raise NotImplementedError

    def _close_file(self) -> None:
        raise NotImplementedError

    def _guarded(self, call, output_dir: str) -> None:
        if self._full:
            return
        try:
            call()
        except OSError as e:
            if not is_disk_full(e):
                raise
            self._full = True
            path = self._written_file()
            with contextlib.suppress(OSError, ValueError):
                self._close_file()
            raise disk_full_error(path, output_dir) from None


class StopOnFullDiskJSONWriter(_StopsOnFullDisk, JSONWriter):
    """Detectron2's ``JSONWriter`` (``metrics.json``), a full disk one :class:`DiskFullError`.

    :meth:`drop_records_from` removes the records of the steps a resumed run trains again."""

    def __init__(self, json_file: str, window_size: int = 20):
        super().__init__(json_file, window_size)
        self._path = json_file

    def _written_file(self) -> str:
        return self._path

    def _close_file(self) -> None:
        self._file_handle.close()

    def write(self):
        self._guarded(super().write, os.path.dirname(self._path))

    def close(self):
        self._guarded(super().close, os.path.dirname(self._path))

    def drop_records_from(self, iteration: int) -> int:
        """Cut the file before its first record of a step >= ``iteration`` (or its first line
        that is not a whole record, as a kill midway through a write leaves): what a run
        resumed at ``iteration`` trains again is written once, by the resumed run. Returns
        the records dropped. The file is appended to, so this writer's next records follow."""
        return drop_metrics_records(self._path, iteration)


class StopOnFullDiskTensorboardXWriter(_StopsOnFullDisk, TensorboardXWriter):
    """Detectron2's ``TensorboardXWriter``, a full disk one :class:`DiskFullError`.

    :meth:`drop_records_from` has TensorBoard drop the events of the steps a resumed run
    trains again (``SummaryWriter``'s ``purge_step``)."""

    def __init__(self, log_dir: str, window_size: int = 20, **kwargs):
        super().__init__(log_dir, window_size, **kwargs)
        self._log_dir = log_dir
        _quiet_tensorboard_thread_on_full_disk()

    def _written_file(self) -> str:
        writer = self.__dict__.get("_writer")
        file_writer = writer.file_writer if writer is not None else None
        name = getattr(getattr(file_writer, "event_writer", None), "_file_name", None)
        return name or os.path.join(self._log_dir, "events.out.tfevents.*")

    def _close_file(self) -> None:
        if "_writer" in self.__dict__:
            self._writer.close()

    def write(self):
        self._guarded(super().write, self._log_dir)

    def close(self):
        self._guarded(super().close, self._log_dir)

    def drop_records_from(self, iteration: int) -> None:
        if "_writer" not in self.__dict__:  # SummaryWriter is made at the first write
            self._writer_args["purge_step"] = iteration


@functools.lru_cache(maxsize=None)
def _quiet_tensorboard_thread_on_full_disk() -> None:
    """Once per process: TensorBoard writes its events in a thread of its own, which, when
    the disk is full, ends with a traceback on stderr before the writer raises the same
    error in the main thread (where :class:`StopOnFullDiskTensorboardXWriter` makes it the
    run's one line). That thread's full-disk error is left unprinted; every other thread
    error goes to the previous ``threading.excepthook``."""
    previous = threading.excepthook

    def excepthook(args):
        if is_disk_full(args.exc_value) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)

    threading.excepthook = excepthook


def drop_metrics_records(path: str, iteration: int) -> int:
    """Truncate the JSON-lines file ``path`` (``metrics.json``) before its first record whose
    ``iteration`` is >= ``iteration``, or its first line that does not parse; returns the
    records dropped (0 when the file does not exist)."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as f:
        lines = f.readlines()
    offset = 0
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
            step = record.get("iteration", -1) if isinstance(record, dict) else -1
        except ValueError:
            step = None
        if step is None or step >= iteration:
            os.truncate(path, offset)
            return len(lines) - i
        offset += len(line)
    return 0


def default_writers_stopping_on_full_disk(output_dir: str, max_iter: int) -> list:
    """Detectron2's ``default_writers`` (console, ``metrics.json``, TensorBoard), the file
    writers :class:`StopOnFullDiskJSONWriter` and :class:`StopOnFullDiskTensorboardXWriter`."""
    PathManager.mkdirs(output_dir)
    return [
        CommonMetricPrinter(max_iter),
        StopOnFullDiskJSONWriter(os.path.join(output_dir, "metrics.json")),
        StopOnFullDiskTensorboardXWriter(output_dir),
    ]


#: the first log file that found no space, until :func:`raise_if_a_log_found_no_space`
_full_log: list = []
#: the streams closed for lack of space: handlers that share them stay silent
_closed_streams: list = []


def stop_log_files_on_full_disk(output_dir: str) -> None:
    """Have every logging handler that writes a file under ``output_dir`` (Detectron2's
    ``setup_logger``: ``log.txt``, ``log.txt.rank<N>``) stop on a full disk: instead of
    logging's ``--- Logging error ---`` block at each record, the file is closed, its
    handlers write no more, and :func:`raise_if_a_log_found_no_space` raises its
    :class:`DiskFullError` (the trainer calls it after every step). Idempotent."""
    root = os.path.abspath(output_dir) + os.sep
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            name = getattr(getattr(handler, "stream", None), "name", None)
            if (
                isinstance(handler, logging.StreamHandler)
                and isinstance(name, str)
                and os.path.abspath(name).startswith(root)
                and not getattr(handler, "_largedet_guarded", False)
            ):
                handler.handleError = functools.partial(_log_write_failed, handler, output_dir)
                handler._largedet_guarded = True


def _log_write_failed(handler: logging.StreamHandler, output_dir: str, record) -> None:
    error = sys.exc_info()[1]
    stream = handler.stream
    if any(stream is s for s in _closed_streams):
        return  # another handler of this file found it full: nothing more to say
    if not is_disk_full(error):
        logging.StreamHandler.handleError(handler, record)
        return
    handler.setLevel(logging.CRITICAL + 1)
    _closed_streams.append(stream)
    with contextlib.suppress(OSError, ValueError):
        stream.close()  # drops the buffered bytes; closed, so nothing is flushed at exit
    if not _full_log:
        _full_log.append(disk_full_error(stream.name, output_dir))


def raise_if_a_log_found_no_space() -> None:
    """Raise the :class:`DiskFullError` of the first log file that found no space, if any
    (once)."""
    if _full_log:
        raise _full_log.pop()


def set_up_log_files(output_dir: str) -> None:
    """Make the loggers of Detectron2's ``default_setup`` (``detectron2``, ``fvcore``: console
    and ``output_dir/log.txt``) before it runs, so that their files stop on a full disk
    (:func:`stop_log_files_on_full_disk`) from its first record on. ``setup_logger`` is
    cached on its arguments: ``default_setup``, called with the same ones, adds no handler."""
    rank = comm.get_rank()
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    setup_logger(output_dir, distributed_rank=rank)
    stop_log_files_on_full_disk(output_dir)




class WandbWriter(EventWriter):
    """Logs the event storage's latest scalars to one W&B run."""

    def __init__(
        self,
        *,
        project: str,
        name: str = "",
        entity: str = "",
        mode: str = "",
        log_dir: str = "",
        config: Optional[Dict] = None,
        window_size: int = 20,
    ):
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
