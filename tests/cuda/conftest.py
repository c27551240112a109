"""Shared pieces of the CUDA tests (``pytest -m cuda tests/cuda``; every test here is marked
``cuda`` and skipped where ``torch.cuda.is_available()`` is False).

They run for the first time on a GPU machine, inside the GPU check
(``benchmarks/gpu_check.py``), so each states its tolerances and what they allow for.
The tests' tiny detector (``tests/engine_testing.py``) imports from ``tests/``, on the import
path by pytest.ini's ``pythonpath``; the video package (``largedet_video``) imports
as installed with largedet, or from the GPU check's PYTHONPATH.
"""

import os
import socket

import pytest
import torch
import torch.distributed as dist

import largedet  # noqa: F401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def nccl_group():
    """A one-process NCCL group (rank 0 of 1, GPU 0) for the rest of the session, destroyed
    at its end; yields the group. With one process torch's ``nn.SyncBatchNorm`` normalizes
    locally (the cross-GPU reduction needs two GPUs), but everything that asks the process
    group (Detectron2's ``comm``, DDP decisions, collectives) sees NCCL."""
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def no_tf32():
    """fp32 convolutions and matmuls in full fp32: cuDNN and cuBLAS may otherwise round their
    inputs to TF32 (10-bit mantissa), and algorithms chosen per batch size then differ by
    ~1e-3, hiding the differences the tests look for."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
