"""A run that stops in one line on a full disk: the file writers of ``metrics.json`` and
TensorBoard (:class:`StopOnFullDiskJSONWriter`, :class:`StopOnFullDiskTensorboardXWriter`)
and the log files (:func:`stop_log_files_on_full_disk`) raise one
:class:`~largedet.checkpoint.DiskFullError` naming the file and the last checkpoint, instead
of a traceback per write; :func:`drop_metrics_records` drops the records of the steps a
resumed run trains again."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import shutil
import sys
import threading

from detectron2.utils import comm
from detectron2.utils.events import JSONWriter, TensorboardXWriter
from detectron2.utils.logger import setup_logger

from ..checkpoint import DiskFullError, is_disk_full, last_checkpoint_state
from .loggers import handlers_writing_under
from .plain_logs import plain_log_files

__all__ = [
    "StopOnFullDiskJSONWriter",
    "StopOnFullDiskTensorboardXWriter",
    "disk_full_error",
    "drop_metrics_records",
    "raise_if_a_log_found_no_space",
    "set_up_log_files",
    "stop_log_files_on_full_disk",
]

logger = logging.getLogger(__name__)


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
    for handler in handlers_writing_under(output_dir):
        if isinstance(handler, logging.StreamHandler) and not getattr(handler, "_largedet_guarded", False):
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
    (:func:`stop_log_files_on_full_disk`) from its first record on and carry no colour codes
    (:func:`~largedet.launch.plain_logs.plain_log_files`). ``setup_logger`` is
    cached on its arguments: ``default_setup``, called with the same ones, adds no handler."""
    rank = comm.get_rank()
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    setup_logger(output_dir, distributed_rank=rank)
    stop_log_files_on_full_disk(output_dir)
    plain_log_files(output_dir)  # the config it logs highlighted: no colour codes in log.txt
