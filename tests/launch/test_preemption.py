"""Pre-emption (PREEMPTION.SIGNALS): a signal mid-run ends the current optimizer step on
every process, writes a checkpoint and exits with status 75; ``--resume`` then trains no
step twice and ends on the weights of an uninterrupted run, on one process, on two gloo
processes (the signal reaching one of them only), and through tools/train_net.py."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from detectron2.engine import HookBase
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from engine_testing import largedet_log, run_on_two_processes, tiny_cfg, weights

import largedet  # noqa: F401
from largedet.data import register_shapes
from largedet.engine import Trainer
from largedet.launch.preemption import PREEMPTED_EXIT_CODE, Preempted, parse_signals
from largedet.launch.processes import shut_down_distributed

OPTS = ("SOLVER.MAX_ITER", 7, "SOLVER.CHECKPOINT_PERIOD", 100, "RESEED_EVERY_ITER", True)


class SignalAt(HookBase):
    """Sends ``sig`` to this process as step ``at`` starts, on rank ``rank`` only."""

    def __init__(self, at, sig=signal.SIGTERM, rank=0):
        self.at, self.sig, self.rank = at, sig, rank

    def before_step(self):
        if self.trainer.iter == self.at and comm.get_rank() == self.rank:
            os.kill(os.getpid(), self.sig)


class CountSteps(HookBase):
    def __init__(self):
        self.steps = []

    def after_step(self):
        self.steps.append(self.trainer.iter)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_saves_the_step_and_resume_trains_no_step_twice(tiny_shapes, tmp_path, caplog, sig):
    seed_all_rng(0)
    straight = Trainer(tiny_cfg(str(tmp_path / "straight"), *OPTS))
    straight.resume_or_load(resume=False)
    straight.train()

    out = tmp_path / "preempted"
    seed_all_rng(0)
    first = Trainer(tiny_cfg(str(out), *OPTS))
    counted = CountSteps()
    first.register_hooks([SignalAt(3, sig), counted])
    first.resume_or_load(resume=False)
    before = signal.getsignal(sig)
    with largedet_log(caplog), pytest.raises(Preempted) as stop:
        first.train()
    assert stop.value.code == PREEMPTED_EXIT_CODE and stop.value.iteration == 3
    assert signal.getsignal(sig) == before  # the handler is put back
    assert (out / "last_checkpoint").read_text() == "model_0000003.pth"
    assert f"pre-empted at iteration 3 ({sig.name}): checkpoint {out / 'model_0000003.pth'}" in caplog.text
    assert counted.steps == [0, 1, 2]  # step 3 ran to its end; hooks after the save did not see it

    seed_all_rng(1)
    resumed = Trainer(tiny_cfg(str(out), *OPTS))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4 and resumed.data.position == 4 * 4  # step 3 is not trained again
    resumed.train()
    final, reference = weights(resumed.model), weights(straight.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []


def test_signals_are_named_and_checked():
    assert parse_signals(["SIGTERM", "SIGUSR2"]) == [signal.SIGTERM, signal.SIGUSR2]
    with pytest.raises(ValueError, match="PREEMPTION.SIGNALS: 'SIGKILL' is not a signal that can be caught"):
        parse_signals(["SIGKILL"])
    with pytest.raises(ValueError, match="'TERM'"):
        parse_signals(["TERM"])


def _two_process_run(spec, output_dir, result_file, signal_at=None, resume=False):
    register_shapes(spec, prefix="tiny_shapes")
    seed_all_rng(0)
    opts = [*OPTS, "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2]
    trainer = Trainer(tiny_cfg(output_dir, *opts))
    if signal_at is not None:
        trainer.register_hooks([SignalAt(signal_at, rank=1)])  # rank 0 gets no signal
    trainer.resume_or_load(resume=resume)
    start, stopped = trainer.start_iter, None
    try:
        trainer.train()
    except Preempted as e:
        stopped = e.iteration
    stops = comm.all_gather(stopped)
    if comm.is_main_process():
        torch.save({"weights": weights(trainer.model), "start": start, "stops": stops}, result_file)
    comm.synchronize()
    shut_down_distributed()


def _straight(spec, output_dir, result_file):
    _two_process_run(spec, output_dir, result_file)


def _signalled(spec, output_dir, result_file):
    _two_process_run(spec, output_dir, result_file, signal_at=2)


def _resumed(spec, output_dir, result_file):
    _two_process_run(spec, output_dir, result_file, resume=True)


def test_two_processes_stop_at_the_same_step_when_one_is_signalled(tiny_shapes, tmp_path):
    straight = run_on_two_processes(_straight, tiny_shapes, tmp_path / "straight")
    signalled = run_on_two_processes(_signalled, tiny_shapes, tmp_path / "preempted")
    assert signalled["stops"] == [2, 2]  # both ranks, at the step the signal arrived in
    assert (tmp_path / "preempted" / "run" / "last_checkpoint").read_text() == "model_0000002.pth"
    resumed = run_on_two_processes(_resumed, tiny_shapes, tmp_path / "preempted")
    assert resumed["start"] == 3 and resumed["stops"] == [None, None]
    reference = straight["weights"]
    assert [k for k in reference if not torch.equal(resumed["weights"][k], reference[k])] == []


ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


def test_train_net_on_two_processes_exits_75_on_sigterm_and_resumes(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    overrides = [
        "DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", str(tiny_shapes.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(tiny_shapes.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(tiny_shapes.image_size),
        "DATASETS.SHAPES.SEED", str(tiny_shapes.seed), "DATASETS.TEST", "()",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "4",
        "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", "2000", "SOLVER.CHECKPOINT_PERIOD", "5000",
        "DATALOADER.NUM_WORKERS", "0", "LOG_PERIOD", "1", "OUTPUT_DIR", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, TRAIN_NET, "--config", CONFIG, "--num-gpus", "2", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 240
    metrics = out / "metrics.json"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # two steps done
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # to the launching process only: it forwards the signal
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output[-3000:]
    checkpoint = (out / "last_checkpoint").read_text()
    stopped = int(checkpoint[len("model_"):-len(".pth")])
    assert stopped >= 1 and f"pre-empted at iteration {stopped} (SIGTERM): checkpoint" in output
    assert "Traceback" not in output

    resume = [sys.executable, TRAIN_NET, "--config", CONFIG, "--num-gpus", "2", "--resume", *overrides,
              "SOLVER.MAX_ITER", str(stopped + 2)]  # fmt: skip
    done = subprocess.run(resume, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Starting training from iteration {stopped + 1}" in done.stdout + done.stderr


def test_run_summary_records_each_invocation_and_how_it_ended(tiny_shapes, tmp_path):
    import json

    out = tmp_path / "run"
    first = Trainer(tiny_cfg(str(out), *OPTS, "SOLVER.IMS_PER_DEVICE", 2))
    first.register_hooks([SignalAt(3)])
    first.resume_or_load(resume=False)
    with pytest.raises(Preempted):
        first.train()
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["status"] == "preempted"
    assert summary["batch"] == {"global_batch": 4, "world_size": 1, "per_device": 2, "accumulation": 2, "ramp": []}
    assert summary["lr"]["peak"] == 0.1 and summary["lr"]["rule"] == "none"
    assert (summary["iterations"], summary["images"], summary["dataset_size"], summary["epochs"]) == (7, 28, 24, 28 / 24)
    resumed = Trainer(tiny_cfg(str(out), *OPTS, "SOLVER.IMS_PER_DEVICE", 2))
    resumed.resume_or_load(resume=True)
    resumed.train()
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["status"] == "finished"
    runs = summary["invocations"]
    assert [(r["start_iter"], r["end_iter"], r["status"]) for r in runs] == [(0, 4, "preempted"), (4, 7, "finished")]
    assert all(r["images_per_s"] > 0 for r in runs)
    assert summary["wall_clock_s"] == pytest.approx(sum(r["wall_clock_s"] for r in runs), abs=0.01)
