"""projects/video/train.py as a cluster treats a job: a signal to its whole process group,
decoding workers included, checkpoints and exits 75, and --resume continues after it."""

import json
import os
import signal
import subprocess
import sys
import time

from largedet.launch.preemption import PREEMPTED_EXIT_CODE
from test_video_train import TRAIN_PY, tiny_overrides


def test_sigterm_to_the_process_group_with_decoding_workers_checkpoints_and_exits_75(
    tiny_shapes, tiny_shapes_spec, tmp_path
):
    out = tmp_path / "run"
    env = dict(os.environ, LARGEDET_DATASETS=os.path.dirname(tiny_shapes), OMP_NUM_THREADS="1")
    args = [*tiny_overrides(tiny_shapes_spec, str(out)), "DATALOADER.NUM_WORKERS", "2", "SOLVER.MAX_ITER", "2000",
            "DATASETS.TEST", "()", "LOG_PERIOD", "1", "SOLVER.CHECKPOINT_PERIOD", "5000"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, TRAIN_PY, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        metrics, deadline = out / "metrics.json", time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # two steps done
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)  # the trainer and its decoding workers
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output[-4000:]
    checkpoint = (out / "last_checkpoint").read_text()
    stopped = int(checkpoint[len("model_"):-len(".pth")])
    assert f"pre-empted at iteration {stopped} (SIGTERM)" in output
    assert "killed by signal" not in output and "Traceback" not in output

    resume = [sys.executable, TRAIN_PY, "--resume", *args, "SOLVER.MAX_ITER", str(stopped + 2)]
    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Starting training from iteration {stopped + 1}" in done.stdout + done.stderr
    logged = [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()]
    assert logged == list(range(stopped + 2))
