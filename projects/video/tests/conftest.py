"""A tiny generated moving-shapes dataset (``largedet_video`` is installed with largedet)."""

# setuptools (and its distutils shim) before anything imports the standard library's
# distutils: Detectron2's collect_env imports torch.utils.cpp_extension, hence setuptools,
# which refuses a stdlib distutils that another library imported earlier in the session.
import setuptools  # noqa: F401,E402

import os

import pytest

# the helpers shared with largedet's tests (tests/launch_testing.py, tests/global_state.py) are
# on the import path: pytest.ini's pythonpath
from global_state import restore_global_state  # noqa: E402,F401  (autouse; tests/)


@pytest.fixture(scope="session")
def tiny_shapes_spec():
    from largedet_video.data import MovingShapesSpec

    return MovingShapesSpec(num_train=8, num_val=4, num_frames=12, width=48, height=32, seed=5)


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory, tiny_shapes_spec):
    """Folder of a tiny generated moving-shapes dataset (8 train, 4 val videos)."""
    from largedet_video.data import prepare_moving_shapes

    return prepare_moving_shapes(tiny_shapes_spec, str(tmp_path_factory.mktemp("datasets")))


@pytest.fixture
def unreadable_records(tmp_path):
    """``make(good)``: records of random bytes, a missing file, the readable video ``good``
    and ``good`` cut after 300 bytes, labelled 0-3, in this test's folder."""

    def make(good):
        corrupt = tmp_path / "corrupt.mp4"
        corrupt.write_bytes(os.urandom(2000))
        truncated = tmp_path / "truncated.mp4"
        truncated.write_bytes(open(good, "rb").read()[:300])
        paths = [corrupt, tmp_path / "missing.mp4", good, truncated]
        return [{"path": str(p), "label": k} for k, p in enumerate(paths)]

    return make


@pytest.fixture
def single_thread():
    """One intra-op thread: on a small, shared machine, torch's default of one
    thread per core spends most of its time waiting for busy cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
