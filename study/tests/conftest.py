"""The study's tests: its packages (``largedet_study``, ``video_study``) are installed by
``make setup`` (``pip install -e study``); the guard against leftover process-wide state is
shared with largedet's tests (tests/global_state.py)."""

# setuptools (and its distutils shim) before anything imports the standard library's
# distutils: Detectron2's collect_env imports torch.utils.cpp_extension, hence setuptools,
# which refuses a stdlib distutils that another library imported earlier in the session.
import setuptools  # noqa: F401,E402

import os
import sys

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from global_state import restore_global_state  # noqa: E402,F401  (autouse)
