"""The start-up warnings of dependencies that a user cannot act on are filtered once, when
largedet is imported; other warnings are shown as before."""

import subprocess
import sys
import warnings

from largedet.utils.startup_warnings import DEPENDENCY_WARNINGS, filter_dependency_warnings


def test_importing_largedet_and_detectron2_prints_no_dependency_warning():
    code = "import largedet.engine, largedet.engine.lazy, warnings; warnings.warn('mine', FutureWarning)"
    proc = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.jit.script` is deprecated" not in proc.stderr
    assert "FutureWarning: mine" in proc.stderr  # another warning of the same category is shown


def test_the_filter_is_added_once():
    before = list(warnings.filters)
    try:
        filter_dependency_warnings()
        filter_dependency_warnings()
        patterns = [f[1].pattern for f in warnings.filters if f[1] is not None]
        for _, message in DEPENDENCY_WARNINGS:
            assert patterns.count(message) == 1
    finally:
        warnings.filters[:] = before
