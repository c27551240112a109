"""Loader workers forked while OpenCV's thread pool runs in the main process.

A parallel OpenCV call in the main process (a bicubic resize to a photo's size) starts
OpenCV's pool; once its threads sleep on the pool's condition (the script waits until every
thread but its own has been asleep for half a second: on a busy machine they spin longer),
a worker forked from the main process that sets OpenCV's thread count (the video loader's
workers do) blocks for ever in the inherited pool's teardown (``pthread_cond_destroy``), or
crashes: the run ends with "DataLoader worker ... exited unexpectedly". Each case runs in a
fresh interpreter, so the pool's state is the script's alone.
"""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import threading
    import time
    import cv2
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
    from largedet.data.workers import WorkerSafeDataLoader, opencv_pool_stopped

    class Resized(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            image = np.full((96, 128, 3), i, np.uint8)
            return torch.from_numpy(cv2.resize(image, (64, 48), interpolation=cv2.INTER_CUBIC))

    def init(worker_id):
        cv2.setNumThreads(1)  # what the video loader's workers do

    # OpenCV's default pool (one thread per core) started as benchmarks/synthetic_coco.py
    # starts it: float32 noise upsampled bicubically to a photo's size
    rng = np.random.default_rng(0)
    for s in (1, 2, 4, 8, 16, 32):
        grid = rng.standard_normal((480 // s + 1, 640 // s + 1, 3), dtype=np.float32)
        cv2.resize(grid, (640, 480), interpolation=cv2.INTER_CUBIC)
    threads = cv2.getNumThreads()

    def others_asleep():
        # the state of every thread but this one (/proc/self/task/<tid>/stat, after the name)
        me = threading.get_native_id()
        states = []
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != me:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        return bool(states) and all(state == "S" for state in states)

    # the pool's threads spin, then sleep on its condition: fork only once they all have slept
    # through 20 polls in a row (0.5 s), however long a busy machine makes them spin
    deadline, asleep = time.monotonic() + 120, 0
    while asleep < 20:
        asleep = asleep + 1 if others_asleep() else 0
        if time.monotonic() > deadline:
            print("POOL NOT ASLEEP", flush=True)
            sys.exit(3)
        time.sleep(0.025)

    cls = {"safe": WorkerSafeDataLoader, "plain": DataLoader}[sys.argv[1]]
    loader = cls(Resized(), batch_size=2, num_workers=1, worker_init_fn=init,
                 multiprocessing_context="fork", timeout=float(sys.argv[2]))
    sums = [int(b.sum()) for b in loader]
    print("BATCHES", sums, "THREADS", cv2.getNumThreads() == threads, threads, flush=True)
    with opencv_pool_stopped():
        print("INSIDE", cv2.getNumThreads(), flush=True)
    """
)


def _run(kind: str, loader_timeout: float, timeout: float):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, kind, str(loader_timeout)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_workers_forked_by_the_safe_loader_run_and_the_pool_comes_back():
    proc = _run("safe", 60, 300)
    assert "POOL NOT ASLEEP" not in proc.stdout
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # 64 x 48 x 3 values of i per image, two images per batch: images 0+1, then 2+3
    per_image = 64 * 48 * 3
    assert f"BATCHES [{per_image * 1}, {per_image * 5}] THREADS True" in proc.stdout
    assert "INSIDE 1" in proc.stdout


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenCV starts no pool on one core")
def test_a_plain_loader_forked_the_same_way_does_not_get_its_batches():
    """The cause, shown: the same loader without the pool stopped loses its worker (a hang
    until the loader's timeout, or a crash)."""
    try:
        proc = _run("plain", 8, 240)
    except subprocess.TimeoutExpired:  # pragma: no cover - the worker hung and so did exit
        return
    assert "POOL NOT ASLEEP" not in proc.stdout
    if "BATCHES" in proc.stdout:
        pytest.fail(
            "the worker forked from a running OpenCV pool got its batches: this OpenCV no "
            "longer needs opencv_pool_stopped; stdout: " + proc.stdout[-500:]
        )
    assert proc.returncode != 0
    assert "DataLoader" in proc.stderr, proc.stderr[-2000:]
