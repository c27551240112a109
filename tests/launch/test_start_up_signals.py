"""A stop signal while a job starts (its check, its model, its resume: before the trainer's
pre-emption hook) exits with the pre-emption status, 75, in one line: not 143 from the
signal's default action, nor 69 from a worker killed by it."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_at_start_up_exits_75_in_one_line(sig):
    code = (
        "import os, signal, time\n"
        # as a job starts: the signal's default action (a test runner's worker may ignore
        # SIGINT, and a child inherits an ignored signal)
        f"signal.signal({int(sig)}, signal.SIG_DFL)\n"
        "from largedet.launch.processes import exit_on_stop_signals\n"
        "exit_on_stop_signals()\n"
        f"os.kill(os.getpid(), {int(sig)})\n"
        "time.sleep(30)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 75, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"{sig.name} outside training (nothing to save): exiting 75; --resume continues from the "
        "newest complete checkpoint"
    )
    assert "Traceback" not in done.stderr


def _signalled_then_clean_up_raises(runner: str, imports: str, error: str):
    """A job's ``runner`` (``_run_alone``, ``_run_then_shut_down``) whose main function
    sends itself SIGTERM; the code the handler's exit interrupts then raises ``error`` in
    its clean-up. The finished process."""
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        f"{imports}\n"
        f"from largedet.launch.processes import {runner}\n"
        "def main(args):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
        "    finally:\n"
        f"        raise {error}\n"
        f"{runner}(main, None)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_stop_signal_exits_75_when_the_code_it_interrupts_fails_in_its_clean_up():
    """The handler's exit interrupts code whose clean-up fails on the half-done state (as
    omegaconf's does, restoring the flags of a node it was building): still 75, one line."""
    done = _signalled_then_clean_up_raises("_run_alone", "", "AttributeError('half-built')")
    assert done.returncode == 75, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "SIGTERM outside training (nothing to save): exiting 75; --resume continues from the "
        "newest complete checkpoint"
    ]


def test_a_stop_signal_exits_75_when_a_collective_then_finds_its_peer_gone():
    """Both processes of a job get the signal; one leaves first, and the other's collective,
    interrupted by its own signal, fails on the lost peer: 75 (the signal), not the
    lost-process status on which torchrun would restart the job."""
    done = _signalled_then_clean_up_raises(
        "_run_then_shut_down", "from largedet.launch.elastic import LostProcessError",
        "LostProcessError('a collective failed: the peer closed the connection')",
    )  # fmt: skip
    assert done.returncode == 75, done.stderr[-2000:]
    assert "a process of the job was lost" not in done.stderr


def test_an_ignored_signal_stays_ignored():
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGUSR2, signal.SIG_IGN)\n"
        "from largedet.launch.processes import exit_on_stop_signals\n"
        "exit_on_stop_signals()\n"
        "assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_train_net_with_two_processes_stopped_while_it_starts_exits_75(tmp_path):
    """SIGTERM to tools/train_net.py --num-gpus 2 once its workers exist, before they train."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, TRAIN_NET, "--config", CONFIG, "--num-gpus", "2",
                             "MODEL.DEVICE", "cpu", "DATALOADER.NUM_WORKERS", "0",
                             "OUTPUT_DIR", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 600  # three interpreters import torch: minutes on a busy machine
        while not (tmp_path / "run" / "log.txt").is_file():  # the workers set up their logs
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert "Traceback" not in err and "killed by" not in err
