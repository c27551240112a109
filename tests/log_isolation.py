"""An autouse fixture for both test trees (tests/ and projects/video/tests/): no logging
handler outlives the stream it writes to.

Detectron2's ``setup_logger`` is cached: a logger set up once keeps its handlers for the
whole process. A test can leave one on a closed stream: the full-disk test's run closes its
``log.txt`` (largedet.launch.full_disk) under the ``detectron2`` and ``largedet`` loggers'
file handlers, and a console handler made while ``capsys`` replaced ``sys.stdout`` writes to
a capture that is closed after that test. Every later record through such a logger prints
logging's ``--- Logging error ---`` block into the next test's output. Which test comes
later depends on the order the files run in (``make test`` spreads the files over two
workers), so after each test such handlers go, and ``setup_logger``'s cache with them (the
next call sets the logger up anew)."""

import logging

import pytest


def _loggers():
    return [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]


def handlers_on_closed_streams():
    """(logger, handler) of every handler whose stream is closed."""
    return [
        (logger, handler)
        for logger in _loggers()
        for handler in list(logger.handlers)
        if getattr(getattr(handler, "stream", None), "closed", False)
    ]


@pytest.fixture(autouse=True)
def no_handler_on_a_closed_stream():
    yield
    leaked = handlers_on_closed_streams()
    for logger, handler in leaked:
        logger.removeHandler(handler)
    if leaked:
        from detectron2.utils.logger import setup_logger

        setup_logger.cache_clear()
