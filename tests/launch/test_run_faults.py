"""Faults around a run's files, in this process: a full disk at each log writer (one line,
exit 74, ``run_summary.json`` not left at ``running``), the lock that makes a live run own
its OUTPUT_DIR, temporary checkpoints of a live process left alone, a signal during the
final evaluation, ``metrics.json`` after a kill and resume, and ``eval_results.json``
without a bare NaN."""

import errno
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from engine_testing import StopAt, tiny_cfg

from largedet.checkpoint import AtomicCheckpointer, CheckpointSpaceError
from largedet.checkpoint import atomic as ckpt
from largedet.engine import Trainer
from largedet.launch.processes import DISK_FULL_EXIT_CODE, NO_CHECKPOINT_EXIT_CODE, _run_alone
from largedet.launch.preemption import PREEMPTED_EXIT_CODE, Preempted
from largedet.launch.run_lock import LOCK_FILE, OutputDirInUseError, OutputDirLock
from largedet.launch.run_summary import read_run_summary, write_eval_results


def _strict_json(path):
    """The file's JSON, refusing NaN and infinities as a strict reader does."""
    def refuse(constant):
        raise ValueError(f"{path} holds a bare {constant}")

    return json.loads(open(path).read(), parse_constant=refuse)


def _no_raw_enospc(err: str) -> bool:
    """No traceback or logging error of the full disk itself (the end-to-end test of
    ``tools/train_net.py`` checks that stderr holds no traceback at all; here, handlers
    that earlier tests left on their closed capture streams may add their own)."""
    return "[Errno 28]" not in err and "No space left on device" not in err


def _error_lines(err: str) -> list:
    return [line for line in err.splitlines() if line.startswith("error:")]


# --- a full disk at a log write --------------------------------------------------------------


def _train_alone(out, *opts):
    def main(args):
        trainer = Trainer(tiny_cfg(str(out), "SOLVER.MAX_ITER", 6, "LOG_PERIOD", 1, *opts))
        trainer.train()

    with pytest.raises(SystemExit) as stop:
        _run_alone(main, None)
    return stop.value.code


def test_a_full_disk_at_metrics_json_is_one_line_and_exit_74(tiny_shapes, tmp_path, capfd):
    out = tmp_path / "run"
    out.mkdir()
    os.symlink("/dev/full", out / "metrics.json")  # every write there fails with ENOSPC
    assert _train_alone(out, "SOLVER.CHECKPOINT_PERIOD", 2) == DISK_FULL_EXIT_CODE
    err = capfd.readouterr().err
    (line,) = _error_lines(err)  # the first write is step 0's: before the first checkpoint
    assert _full_disk_line(line, out / "metrics.json", "no checkpoint had been written (--resume starts from scratch)")
    assert _no_raw_enospc(err)
    summary = _strict_json(out / "run_summary.json")
    assert summary["status"] == "failed" and summary["invocations"][-1]["end_iter"] == 0


def _full_disk_line(line: str, path, state: str) -> bool:
    """Whether ``line`` is the one-line error of a full disk at the log file ``path``."""
    return re.fullmatch(
        re.escape(f"error: {path}: no space left on the device while writing the run's logs (")
        + r"\d+" + re.escape(f" bytes free); training stopped; {state}"),
        line,
    ) is not None


def test_a_full_disk_at_tensorboard_events_is_one_line_and_exit_74(tiny_shapes, tmp_path, capfd, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def add_scalar(self, tag, value, step, *args, **kwargs):
        if step >= 2:  # steps 0 and 1 have room; the disk fills in step 2, after its checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar)
    out = tmp_path / "run"
    assert _train_alone(out, "SOLVER.CHECKPOINT_PERIOD", 1) == DISK_FULL_EXIT_CODE
    err = capfd.readouterr().err
    (line,) = _error_lines(err)
    assert line.startswith(f"error: {out}{os.sep}events.out.tfevents.") and "no space left on the device" in line
    assert line.endswith("the previous checkpoint model_0000002.pth and last_checkpoint are unchanged")
    assert _no_raw_enospc(err)
    assert _strict_json(out / "run_summary.json")["status"] == "failed"


def test_a_full_disk_at_log_txt_is_one_line_and_exit_74(tiny_shapes, tmp_path, capfd):
    import logging

    from detectron2.utils.logger import setup_logger

    from largedet.engine.writers import stop_log_files_on_full_disk

    out = tmp_path / "run"
    out.mkdir()
    os.symlink("/dev/full", out / "log.txt")
    name = f"largedet.test_log_txt.{os.getpid()}"
    setup_logger(str(out), name=name)
    stop_log_files_on_full_disk(str(out))
    log = logging.getLogger(name)

    class LogEveryStep(Trainer):
        def run_step(self):
            super().run_step()
            for _ in range(3):
                log.info("step %d done", self.iter)

    def main(args):
        LogEveryStep(tiny_cfg(str(out), "SOLVER.MAX_ITER", 6)).train()

    with pytest.raises(SystemExit) as stop:
        _run_alone(main, None)
    assert stop.value.code == DISK_FULL_EXIT_CODE
    err = capfd.readouterr().err
    (line,) = _error_lines(err)
    assert _full_disk_line(line, out / "log.txt", "no checkpoint had been written (--resume starts from scratch)")
    assert _no_raw_enospc(err)
    summary = _strict_json(out / "run_summary.json")
    assert summary["status"] == "failed" and summary["invocations"][-1]["end_iter"] == 0


def test_run_summary_on_a_full_disk_is_rewritten_in_place(tmp_path, monkeypatch):
    """Where no new file fits, the summary's own blocks take its final state."""
    from largedet.launch import run_summary

    path = tmp_path / "run_summary.json"
    run_summary._write_json(str(path), {"status": "running", "note": "x" * 100})
    real_open = open

    def no_new_files(file, mode="r", *args, **kwargs):
        if str(file).endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_new_files)
    run_summary._write_json(str(path), {"status": "failed"})
    monkeypatch.undo()
    assert _strict_json(path) == {"status": "failed"} and os.listdir(tmp_path) == ["run_summary.json"]


def test_a_real_full_disk_stops_in_one_line_and_the_summary_says_failed(tiny_shapes, tmp_path, capfd):
    """A small tmpfs filled mid-run: whichever writer finds it full first, one line and 74."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        from detectron2.engine import HookBase

        out = mount / "run"

        class FillTheDiskAt(HookBase):
            def after_step(self):
                if self.trainer.iter == 3:
                    with open(mount / "filler", "wb") as f:
                        try:
                            while True:
                                f.write(b"\0" * 65536)
                                f.flush()
                        except OSError as e:
                            assert e.errno == errno.ENOSPC

        def main(args):
            trainer = Trainer(tiny_cfg(str(out), "SOLVER.MAX_ITER", 8, "LOG_PERIOD", 1, "SOLVER.CHECKPOINT_PERIOD", 2))
            trainer.register_hooks([FillTheDiskAt()])
            trainer.train()

        with pytest.raises(SystemExit) as stop:
            _run_alone(main, None)
        assert stop.value.code == DISK_FULL_EXIT_CODE
        err = capfd.readouterr().err
        (line,) = _error_lines(err)
        assert "no space left on the device" in line and str(out) in line
        assert _no_raw_enospc(err)
        assert _strict_json(out / "run_summary.json")["status"] == "failed"
        assert (out / "last_checkpoint").read_text() == "model_0000003.pth"
        assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    finally:
        subprocess.run(["umount", str(mount)], check=True)


TENSORBOARD_ON_A_FULL_DISK = """
import sys, time
from detectron2.utils.events import EventStorage
from largedet.checkpoint import DiskFullError
from largedet.engine.writers import StopOnFullDiskTensorboardXWriter

writer = StopOnFullDiskTensorboardXWriter(sys.argv[1], flush_secs=0.05)
with open(sys.argv[2], "wb") as f:
    try:
        while True:
            f.write(bytes(65536))
            f.flush()
    except OSError:
        pass
deadline = time.monotonic() + 30
with EventStorage(0) as storage:
    try:
        while time.monotonic() < deadline:  # until the thread's flush fails and the writer says so
            storage.put_scalar("loss", 1.0)
            writer.write()
            storage.step()
            time.sleep(0.05)
    except DiskFullError as e:
        print(f"error: {e}", file=sys.stderr)
        writer.close()  # closed already: nothing more
        sys.exit(74)
"""


def test_tensorboard_s_own_thread_on_a_full_disk_prints_no_traceback(tmp_path):
    """TensorBoard flushes its events in a thread; on a full disk that thread's error is the
    writer's one DiskFullError, not also a thread's traceback on stderr."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        run = subprocess.run([sys.executable, "-c", TENSORBOARD_ON_A_FULL_DISK, str(mount), str(mount / "filler")],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert run.returncode == 74, run.stderr[-3000:]
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: {mount}{os.sep}events.out.tfevents.")
    assert "Exception in thread" not in run.stderr and "Traceback" not in run.stderr


def test_the_full_disk_line_of_a_first_checkpoint_says_there_was_none(tmp_path, monkeypatch):
    from torch import nn

    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    monkeypatch.setattr(ckpt, "_free_bytes", lambda directory: 0)
    with pytest.raises(CheckpointSpaceError) as e:
        AtomicCheckpointer(nn.Linear(2, 2), str(tmp_path)).save("model_0000000")
    assert str(e.value).endswith("are free; no checkpoint had been written (--resume starts from scratch)")


# --- one live run per OUTPUT_DIR -------------------------------------------------------------

HOLD_LOCK = """
import sys
from largedet.launch.run_lock import OutputDirLock
lock = OutputDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_live_run_owns_its_output_dir_and_a_dead_one_blocks_nothing(tmp_path):
    out = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, out], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(OutputDirInUseError) as refused:
            OutputDirLock(out).acquire()
        message = str(refused.value)
        assert message.startswith(f"{os.path.join(out, LOCK_FILE)}: OUTPUT_DIR {out} is in use by a live run (pid {holder.pid} on ")
        assert "\n" not in message and message.endswith("give this run another OUTPUT_DIR")
    finally:
        holder.communicate("")  # ends it
    assert os.path.isfile(os.path.join(out, LOCK_FILE))  # its file stays, and blocks nothing
    with OutputDirLock(out):
        assert open(os.path.join(out, LOCK_FILE)).read().startswith(f"pid {os.getpid()} on ")


def test_clean_up_leaves_a_live_process_s_temporary_checkpoint(tmp_path):
    from torch import nn

    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its id names no process
    try:
        theirs = f".model_0000004.pth.{live.pid}-0123abcd.tmp"
        leftover = f".model_0000002.pth.{dead.pid}-89abcdef.tmp"
        old_style = ".last_checkpoint.abcd1234.tmp"
        for name in (theirs, leftover, old_style):
            (tmp_path / name).write_bytes(b"partial")
        AtomicCheckpointer(nn.Linear(2, 2), str(tmp_path)).save("model_0000005")
        assert sorted(os.listdir(tmp_path)) == sorted([theirs, "last_checkpoint", "model_0000005.pth"])
    finally:
        live.communicate(b"")


# --- a signal during the final evaluation ----------------------------------------------------


class SignalledDuringEvaluation(Trainer):
    """Its evaluation sends SIGTERM to this process, as a cluster would midway through."""

    signal_evaluation = True
    evaluations = 0

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        cls.evaluations += 1
        if cls.signal_evaluation:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):  # the evaluation's work, which the signal interrupts
                pass
        return {"bbox": {"AP": 50.0, "AP-circle": float("nan")}}


def test_a_signal_during_the_final_evaluation_exits_75_and_resume_evaluates(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    opts = ("SOLVER.MAX_ITER", 3, "DATASETS.TEST", ("tiny_shapes_val",), "TEST.EVAL_PERIOD", 0)
    first = SignalledDuringEvaluation(tiny_cfg(str(out), *opts))
    first.resume_or_load(resume=False)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as stop:
        first.train()
    assert stop.value.code == PREEMPTED_EXIT_CODE and SignalledDuringEvaluation.evaluations == 1
    assert signal.getsignal(signal.SIGTERM) == before
    summary = read_run_summary(str(out))
    assert summary["status"] == "preempted"
    assert [(r["start_iter"], r["end_iter"]) for r in summary["invocations"]] == [(0, 3)]
    assert (out / "last_checkpoint").read_text() == "model_final.pth"

    SignalledDuringEvaluation.signal_evaluation = False
    resumed = SignalledDuringEvaluation(tiny_cfg(str(out), *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 3  # nothing left to train
    results = resumed.train()
    assert results["bbox"]["AP"] == 50.0 and SignalledDuringEvaluation.evaluations == 2
    summary = read_run_summary(str(out))
    assert summary["status"] == "finished"
    assert [(r["start_iter"], r["end_iter"], r["status"]) for r in summary["invocations"]] == [
        (0, 3, "preempted"), (3, 3, "finished")
    ]  # fmt: skip


class SignalledDuringEvaluationWhoseCleanUpFails(Trainer):
    """The signal's exit interrupts code whose clean-up then fails on the half-done state
    (as omegaconf's does, restoring the flags of a node it was building)."""

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):
                pass
        finally:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")


def test_a_signal_during_the_final_evaluation_stays_a_preemption_when_the_clean_up_fails(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    opts = ("SOLVER.MAX_ITER", 2, "DATASETS.TEST", ("tiny_shapes_val",), "TEST.EVAL_PERIOD", 0)
    trainer = SignalledDuringEvaluationWhoseCleanUpFails(tiny_cfg(str(out), *opts))
    trainer.resume_or_load(resume=False)
    with pytest.raises(Preempted) as stop:
        trainer.train()
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert read_run_summary(str(out))["status"] == "preempted"


# --- metrics.json after a kill and resume ------------------------------------------------------


def test_metrics_json_holds_each_step_once_after_a_kill_and_resume(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    opts = ("SOLVER.MAX_ITER", 7, "SOLVER.CHECKPOINT_PERIOD", 2, "LOG_PERIOD", 1)
    first = Trainer(tiny_cfg(str(out), *opts))
    first.register_hooks([StopAt(5)])  # killed before step 5: step 4 is logged, the checkpoint is 3
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    with open(out / "metrics.json", "a") as f:
        f.write('{"iteration": 5, "loss_bo')  # a kill midway through a write
    resumed = Trainer(tiny_cfg(str(out), *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4
    resumed.train()
    logged = [json.loads(line)["iteration"] for line in open(out / "metrics.json")]
    assert logged == list(range(7))


def test_eval_results_json_holds_no_bare_nan(tmp_path):
    import numpy as np

    write_eval_results(str(tmp_path), {"bbox": {"AP": np.float32(41.5), "AP-kite": float("nan"), "n": np.int64(3),
                                                "APl": float("inf")}})  # fmt: skip
    assert _strict_json(tmp_path / "eval_results.json") == {"bbox": {"AP": 41.5, "AP-kite": None, "n": 3, "APl": None}}


# --- --resume with no checkpoint that loads -------------------------------------------------


def test_resume_with_every_checkpoint_corrupt_is_one_line_and_exit_66(tiny_shapes, tmp_path, capfd):
    out = tmp_path / "run"
    trainer = Trainer(tiny_cfg(str(out), "SOLVER.MAX_ITER", 4, "SOLVER.CHECKPOINT_PERIOD", 2))
    trainer.resume_or_load(resume=False)
    trainer.train()
    checkpoints = sorted(p.name for p in out.glob("model_*.pth"))
    assert len(checkpoints) >= 2
    for name in checkpoints:  # cut short, as by a copy that stopped half-way
        data = (out / name).read_bytes()
        (out / name).write_bytes(data[: len(data) // 3])
    capfd.readouterr()

    def main(args):
        Trainer(tiny_cfg(str(out), "SOLVER.MAX_ITER", 6)).resume_or_load(resume=True)

    with pytest.raises(SystemExit) as stop:
        _run_alone(main, None)
    assert stop.value.code == NO_CHECKPOINT_EXIT_CODE == 66
    (line,) = _error_lines(capfd.readouterr().err)
    assert line.startswith(f"error: --resume: no checkpoint in {out} loads completely (")
    assert all(f"{name}: does not load" in line for name in checkpoints)
    assert "restore a checkpoint, or remove these files (and last_checkpoint)" in line
    assert sorted(p.name for p in out.glob("model_*.pth")) == checkpoints  # nothing removed


def test_weights_at_a_url_that_cannot_be_fetched_are_one_line_and_exit_66(tiny_shapes, tmp_path, capfd):
    """An offline node's ``detectron2://`` weights: a URL that refuses the connection here."""
    url = "http://127.0.0.1:9/ImageNetPretrained/R-50.pkl"
    capfd.readouterr()

    def main(args):
        Trainer(tiny_cfg(str(tmp_path / "run"), "MODEL.WEIGHTS", url)).resume_or_load(resume=False)

    with pytest.raises(SystemExit) as stop:
        _run_alone(main, None)
    assert stop.value.code == NO_CHECKPOINT_EXIT_CODE == 66
    (line,) = _error_lines(capfd.readouterr().err)
    assert line.startswith(f"error: {url}: cannot be fetched (URLError: ")
    assert line.endswith("on a machine without internet, fetch the file where there is one and give its path")
