"""tests/global_state.py: what the autouse fixture puts back after each test, and that a test
run after one that changed process-wide state sees it as it was."""

import io
import logging
import os
import signal
import textwrap

import torch
from detectron2.data import DatasetCatalog
from detectron2.modeling import BACKBONE_REGISTRY

from global_state import Snapshot, handlers_on_closed_streams

pytest_plugins = ["pytester"]


def test_only_handlers_on_closed_streams_are_found():
    logger = logging.getLogger("largedet.test_global_state")
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


def test_a_snapshot_puts_back_what_a_test_changed(tmp_path):
    logger = logging.getLogger("detectron2")
    before = (list(logger.handlers), logger.level, logger.propagate)
    threads = torch.get_num_threads()
    snapshot = Snapshot.take()
    added = logging.StreamHandler(io.StringIO())
    logger.addHandler(added)
    logger.propagate = not logger.propagate
    logger.setLevel(logging.DEBUG if logger.level != logging.DEBUG else logging.ERROR)
    os.environ["LARGEDET_GLOBAL_STATE_PROBE"] = "1"
    os.chdir(tmp_path)
    signal.signal(signal.SIGUSR2, lambda *_: None)
    torch.set_num_threads(threads + 1)
    DatasetCatalog.register("global_state_probe", list)

    @BACKBONE_REGISTRY.register()
    def global_state_probe_backbone(cfg, input_shape):  # registered by a test: it goes
        raise AssertionError

    changed = snapshot.restore()
    assert (list(logger.handlers), logger.level, logger.propagate) == before
    assert added.stream.closed is False and added not in logger.handlers
    assert "LARGEDET_GLOBAL_STATE_PROBE" not in os.environ
    assert os.getcwd() == snapshot.cwd
    assert signal.getsignal(signal.SIGUSR2) == snapshot.signals[signal.SIGUSR2]
    assert torch.get_num_threads() == threads
    assert "global_state_probe" not in DatasetCatalog
    assert "global_state_probe_backbone" not in BACKBONE_REGISTRY
    assert {"logger detectron2", "os.environ", "working directory", "handler of SIGUSR2", "DatasetCatalog",
            "registry BACKBONE"} <= set(changed)  # fmt: skip
    assert Snapshot.take().restore() == []  # nothing changed since: nothing to put back


LEAKY = '''
    import logging, os

    def test_a_leaves_state_behind():
        logger = logging.getLogger("largedet")
        logger.addHandler(logging.StreamHandler())
        logger.propagate = False
        os.environ["LARGEDET_GLOBAL_STATE_PROBE"] = "1"

    def test_b_sees_it_as_it_was():
        logger = logging.getLogger("largedet")
        assert logger.handlers == [] and logger.propagate
        assert "LARGEDET_GLOBAL_STATE_PROBE" not in os.environ
'''


def _run_in_order(pytester, conftest):
    """The two tests in this order in a pytest process of their own, with ``tests/`` on its
    import path as in the suite (pytest.ini's ``pythonpath``)."""
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_leaky=textwrap.dedent(LEAKY))
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-o", f"pythonpath={tests}")


def test_a_test_after_one_that_leaves_a_logger_changed_sees_it_as_it_was(pytester):
    _run_in_order(pytester, "from global_state import restore_global_state\n").assert_outcomes(passed=2)


def test_without_the_fixture_the_same_order_fails(pytester):
    _run_in_order(pytester, "").assert_outcomes(passed=1, failed=1)
