"""PyAV in loader workers forked after the main process decoded: the workers read their
clips (before, every forked worker waited for ever in its first conversion to RGB).

PyAV converts a frame to RGB with one swscale context per thread, kept for the thread's
life, with FFmpeg's automatic slice threads; a worker forked from a process that has
converted a frame inherits the context without its threads and waits for them for ever
(``pthread_cond_wait`` in ``avpriv_slicethread_execute``), and freeing an inherited decoder
that has slice threads waits the same way (``pthread_cond_destroy``). The main process
decodes first in the study's in-process runs and evaluations, so any later loader with
forked workers in that process (a test, an evaluation after training) hung until the
loader's timeout. Each case runs in a fresh interpreter, so PyAV's state is the script's.
"""

import os
import subprocess
import sys
import textwrap

import av
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from torch.utils.data import Dataset
    from largedet.data.workers import WorkerSafeDataLoader
    from largedet_video.data.decoding import open_video
    from largedet_video.data.moving_shapes import write_mp4

    path = sys.argv[1]
    # frame i is flat grey 8 i: what a read returns is known exactly (x264 at crf 20 keeps a
    # flat frame within a step or two)
    frames = np.repeat(np.arange(12, dtype=np.uint8)[:, None, None, None] * 8, 3, axis=3)
    write_mp4(path, np.ascontiguousarray(np.broadcast_to(frames, (12, 32, 48, 3))))

    def read(i):
        with open_video(path, "pyav") as video:
            return video.read(np.array([i, i + 4]))

    class Clips(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.from_numpy(read(i))

    # the main process decodes first (and keeps the clip, as a cache would)
    kept = read(0)
    loader = WorkerSafeDataLoader(Clips(), batch_size=2, num_workers=1, multiprocessing_context="fork",
                                  timeout=float(sys.argv[2]))
    means = [[round(float(c.float().mean()) / 8) for c in clip[:, 0]] for batch in loader for clip in batch]
    print("MEANS", means, "KEPT", [round(float(f.mean()) / 8) for f in kept], flush=True)
    """
)


@pytest.mark.skipif("libx264" not in av.codecs_available, reason="PyAV has no libx264 encoder")
def test_forked_workers_decode_after_the_main_process_did(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "grey.mp4"), "60"],
        capture_output=True, text=True, timeout=150, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # every clip of both batches, frames i and i + 4 (grey 8 i and 8 (i + 4))
    assert "MEANS [[0, 4], [1, 5], [2, 6], [3, 7]] KEPT [0, 4]" in proc.stdout, proc.stdout
