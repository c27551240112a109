"""The process's loggers, enumerated once: the root logger and every named logger that
``logging``'s manager holds (its placeholders, names with no logger yet, left out)."""

from __future__ import annotations

import logging
import os
from typing import Iterator, List

__all__ = ["all_loggers", "handlers_writing_under"]


def all_loggers() -> List[logging.Logger]:
    """The root logger, then every logger created so far, in creation order."""
    return [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]


def handlers_writing_under(folder: str) -> Iterator[logging.Handler]:
    """Each handler of :func:`all_loggers` whose stream is a file under ``folder`` (once for
    each logger that holds it)."""
    root = os.path.abspath(folder) + os.sep
    for lg in all_loggers():
        for handler in lg.handlers:
            name = getattr(getattr(handler, "stream", None), "name", None)
            if isinstance(name, str) and os.path.abspath(name).startswith(root):
                yield handler
