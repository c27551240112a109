"""tests/log_isolation.py: the handlers that the autouse fixture removes after each test."""

import io
import logging

from log_isolation import handlers_on_closed_streams


def test_only_handlers_on_closed_streams_are_found():
    logger = logging.getLogger("largedet.test_log_isolation")
    closed, open_ = io.StringIO(), io.StringIO()
    on_closed, on_open = logging.StreamHandler(closed), logging.StreamHandler(open_)
    logger.addHandler(on_closed)
    logger.addHandler(on_open)
    try:
        assert (logger, on_closed) not in handlers_on_closed_streams()
        closed.close()
        found = [h for lg, h in handlers_on_closed_streams() if lg is logger]
        assert found == [on_closed]
    finally:
        logger.removeHandler(on_closed)
        logger.removeHandler(on_open)
