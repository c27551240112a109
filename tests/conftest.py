"""Shared fixtures: a tiny shapes dataset in a temporary cache, the OpenImages fixture, and
CPU-friendly torch settings."""

# setuptools (and its distutils shim) before anything imports the standard library's
# distutils: Detectron2's collect_env imports torch.utils.cpp_extension, hence setuptools,
# which refuses a stdlib distutils that another library imported earlier in the session.
import setuptools  # noqa: F401,E402

import os

import pytest  # noqa: E402
import torch  # noqa: E402

# tests/ and benchmarks/ are on the import path (pytest.ini's pythonpath): the shared guard, and
# the speed benchmarks' helper modules (time_guard.py, synthetic_coco.py, ...) by name
from global_state import restore_global_state  # noqa: E402,F401  (autouse)

# `make test` runs two pytest-xdist workers with OMP_NUM_THREADS=1 (one core each, and every
# training process a test starts inherits the one thread); a plain `pytest` keeps two threads
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def datasets_root(tmp_path_factory):
    """A private dataset cache for the test session."""
    root = tmp_path_factory.mktemp("datasets")
    return str(root)


@pytest.fixture(scope="session")
def tiny_shapes(datasets_root):
    """A 24-train / 8-val shapes dataset, generated once and registered as ``tiny_shapes_*``."""
    from largedet.data import ShapesSpec, generate_shapes, register_shapes

    spec = ShapesSpec(num_train=24, num_val=8, image_size=64, seed=3, root=datasets_root)
    generate_shapes(spec)
    register_shapes(spec, prefix="tiny_shapes")
    return spec


@pytest.fixture(scope="session")
def openimages_fixture(datasets_root):
    """The generated OpenImages fixture registered as ``openimages_fixture_{train,val}``,
    written under the session's dataset cache on first load; returns its folder."""
    from largedet.data.openimages.fixture import register_openimages_fixture

    root = os.path.join(datasets_root, "openimages_fixture")
    register_openimages_fixture(root, cache_dir=os.path.join(datasets_root, "openimages_cache"))
    return root
