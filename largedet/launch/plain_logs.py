"""Log files without colour codes: Detectron2's ``default_setup`` logs the config file and
the full config highlighted for a terminal (ANSI escape codes), and its file handlers write
them as they are. :func:`plain_log_files` gives the handlers that write files under a run's
folder a formatter that drops those codes; the console keeps its colours."""

from __future__ import annotations

import logging
import re

from .loggers import handlers_writing_under

__all__ = ["ANSI_CODE", "PlainFormatter", "plain_log_files"]

#: an ANSI escape sequence (colours, bold, reset)
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class PlainFormatter(logging.Formatter):
    """``inner``'s output with the ANSI escape codes removed."""

    def __init__(self, inner: logging.Formatter):
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return ANSI_CODE.sub("", self.inner.format(record))


def plain_log_files(output_dir: str) -> None:
    """Give every logging handler that writes a file under ``output_dir`` a
    :class:`PlainFormatter` around its formatter. Idempotent."""
    for handler in handlers_writing_under(output_dir):
        if not isinstance(handler.formatter, PlainFormatter):
            handler.setFormatter(PlainFormatter(handler.formatter or logging.Formatter()))
