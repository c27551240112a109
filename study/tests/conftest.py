"""The study's tests: its packages (``largedet_study``, ``video_study``) are installed by
``make setup`` (``pip install -e study``); the guard against leftover process-wide state is
shared with largedet's tests (tests/global_state.py, on the import path by pytest.ini's
``pythonpath``)."""

# setuptools (and its distutils shim) before anything imports the standard library's
# distutils: Detectron2's collect_env imports torch.utils.cpp_extension, hence setuptools,
# which refuses a stdlib distutils that another library imported earlier in the session.
import setuptools  # noqa: F401,E402

from global_state import restore_global_state  # noqa: E402,F401  (autouse)
