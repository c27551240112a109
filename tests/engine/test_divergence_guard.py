"""The divergence guard: when a step diverges, and what the run then does."""

import copy
import json
import math
import os
import statistics
from types import SimpleNamespace

import pytest
import torch
from engine_testing import tiny_cfg, weights

import largedet  # noqa: F401
from detectron2.engine import HookBase
from detectron2.utils.env import seed_all_rng
from largedet.engine import DivergenceGuard, Trainer


def test_check_non_finite_and_spikes():
    guard = DivergenceGuard(spike_factor=10, window=3)
    assert "non-finite loss nan" in guard.check(math.nan)
    assert "non-finite loss inf" in guard.check(math.inf)
    assert guard.check(1e6) == ""  # no spike test before the window is full
    guard.history.extend([1.0, 3.0, 2.0])
    assert guard.check(20.0) == ""  # 10 x median 2.0 is not exceeded
    assert guard.check(20.5) == "loss 20.5 > 10 x 2, the median of the last 3 steps"
    assert DivergenceGuard(spike_factor=0, window=1).check(1e30) == ""  # spike test off
    with pytest.raises(ValueError):
        DivergenceGuard(spike_factor=0.5)


def test_a_non_finite_gradient_diverges_unless_a_gradient_scaler_handles_it():
    guard = DivergenceGuard()
    loop = SimpleNamespace(
        last_total_loss=1.0, last_grad_norm=math.inf, last_losses={"loss": 1.0},
        grad_scaler=torch.amp.GradScaler("cpu"),
    )  # fmt: skip
    guard.trainer = SimpleNamespace(loop=loop, iter=7, checkpointer=None)
    guard.after_step()  # fp16: the scaler skipped the step and lowered its scale
    assert list(guard.history) == [1.0]
    guard.trainer.loop.grad_scaler = None
    guard.trainer.checkpointer = SimpleNamespace(has_checkpoint=lambda: False)
    with pytest.raises(FloatingPointError, match=r"iteration 7: non-finite gradient \(norm inf\)"):
        guard.after_step()


class ScaleLossAt(HookBase):
    """Multiplies the model's losses by ``factor`` during the first run of iteration ``at``
    only (a rollback runs it again)."""

    def __init__(self, at, factor):
        self.at, self.factor = at, factor
        self.fired = False

    def before_step(self):
        fire = self.trainer.iter == self.at and not self.fired
        self.fired |= fire
        self.trainer.model.loss_scale = self.factor if fire else 1.0


def run(tmp_path, *opts, at=3, factor=math.nan, extra_hooks=()):
    seed_all_rng(0)
    trainer = Trainer(
        tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 6, "SOLVER.CHECKPOINT_PERIOD", 2, *opts)
    )
    trainer.register_hooks([ScaleLossAt(at, factor), *extra_hooks])
    trainer.train()
    return trainer


def test_non_finite_loss_stops_with_the_losses_and_the_last_good_checkpoint(tiny_shapes, tmp_path):
    with pytest.raises(FloatingPointError) as error:
        run(tmp_path)
    message = str(error.value)
    assert message.startswith(
        "Training diverged at iteration 3: non-finite loss nan; loss_dict = {"
    )
    assert "'loss_box': nan" in message and "'loss_cls': nan" in message
    assert message.endswith(f"Last good checkpoint: {tmp_path / 'model_0000001.pth'}")
    # the guard runs before the checkpointer: the diverged step is never saved
    assert not os.path.exists(tmp_path / "model_0000003.pth")
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def test_a_spike_stops_the_run(tiny_shapes, tmp_path):
    with pytest.raises(
        FloatingPointError,
        match=r"iteration 3: loss [0-9.e+]+ > 10 x [0-9.]+, the median of the last 2 steps",
    ):
        run(tmp_path, "SOLVER.DIVERGENCE.WINDOW", 2, factor=1000.0)


class Record(HookBase):
    """At the start of every step: the iteration, weights, LR, optimizer and scheduler state,
    AGVM's mu and the data position."""

    def __init__(self):
        self.steps = []

    def before_step(self):
        t = self.trainer
        self.steps.append(
            {
                "iter": t.iter,
                "weights": weights(t.model),
                "lr": t.optimizer.param_groups[0]["lr"],
                "optimizer": copy.deepcopy(t.optimizer.state_dict()),
                "scheduler": copy.deepcopy(t.scheduler.state_dict()),
                "mu": dict(t.loop.agvm.mu) if t.loop.agvm is not None else None,
                "data_position": t.data.position,
            }
        )


def test_a_divergence_stops_the_script_in_one_logged_line_and_exit_65(tiny_shapes, tmp_path, caplog, capfd):
    """Through the scripts' launch: no traceback, the guard's line once in the log, exit 65."""
    import logging

    from largedet.launch.processes import DIVERGED_EXIT_CODE, _run_alone

    loop_logger = logging.getLogger("detectron2.engine.train_loop")
    loop_logger.addHandler(caplog.handler)
    try:
        with pytest.raises(SystemExit) as stop:
            _run_alone(lambda args: run(tmp_path), None)
    finally:
        loop_logger.removeHandler(caplog.handler)
    assert stop.value.code == DIVERGED_EXIT_CODE == 65
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().startswith("Training diverged at iteration 3: non-finite loss nan")
    assert f"Last good checkpoint: {tmp_path / 'model_0000001.pth'}; lower SOLVER.BASE_LR" in record.getMessage()
    assert record.exc_info is None and "Traceback" not in capfd.readouterr().err


def test_rollback_restores_the_last_good_checkpoint_and_lowers_the_lr(tiny_shapes, tmp_path):
    record = Record()
    trainer = run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, "SOLVER.DIVERGENCE.ROLLBACK_LR_FACTOR", 0.25,
                  extra_hooks=[record])  # fmt: skip
    # NaN at iteration 3: back to model_0000001 (iteration 1), then 2 ... 5 again
    assert [step["iter"] for step in record.steps] == [0, 1, 2, 3, 2, 3, 4, 5]
    assert trainer.iter == 6  # the run went on to the end
    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=False)
    after = record.steps[4]
    assert all(torch.equal(after["weights"][k], saved["model"][k]) for k in saved["model"])
    assert after["lr"] == pytest.approx(0.1 * 0.25)  # after warmup the schedule is at BASE_LR 0.1
    assert after["data_position"] == 4 * 4  # the data stream went on: 4 steps of 4 images
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.025, 0.025])
    final = torch.load(tmp_path / "model_final.pth", weights_only=False)["trainer"]["hooks"]
    assert final["DivergenceGuard"]["rollbacks"] == 1
    assert final["LRScheduler"]["base_lrs"] == pytest.approx([0.025, 0.025])


class InfiniteGradientAt(HookBase):
    """During the first run of iteration ``at`` only, the gradient of the parameter ``name``
    becomes +inf (a tensor hook on it): the loss stays finite. (The hook is removed at the
    next ``before_step``: after a rollback the hooks after the guard get no ``after_step``.)"""

    def __init__(self, at, name="head.weight"):
        self.at, self.name = at, name
        self.fired = False
        self.handle = None

    def before_step(self):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self.trainer.iter == self.at and not self.fired:
            self.fired = True
            param = dict(self.trainer.model.named_parameters())[self.name]
            self.handle = param.register_hook(lambda g: torch.full_like(g, math.inf))


def assert_finite_checkpoints(folder):
    """Every checkpoint in ``folder``, and the tagged one, holds finite weights only."""
    files = sorted(name for name in os.listdir(folder) if name.endswith(".pth"))
    assert (folder / "last_checkpoint").read_text() in files
    for name in files:
        model = torch.load(folder / name, weights_only=False)["model"]
        assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point()), name


def test_an_infinite_gradient_with_a_finite_loss_is_not_stepped_and_stops(tiny_shapes, tmp_path):
    record = Record()
    with pytest.raises(FloatingPointError) as error:
        run(tmp_path, at=-1, extra_hooks=[InfiniteGradientAt(3), record])
    assert "iteration 3: non-finite gradient (norm inf) with a finite loss; step skipped" in str(
        error.value
    )
    assert "'loss_box': nan" not in str(error.value)  # the loss was finite
    # the step was skipped: the weights are those it started from (the trainer still holds them)
    final = weights(record.trainer.model)
    assert all(torch.equal(final[k], record.steps[-1]["weights"][k]) for k in final)
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"
    assert not os.path.exists(tmp_path / "model_0000003.pth")
    assert_finite_checkpoints(tmp_path)


AGVM_OPTS = [
    "SOLVER.IMS_PER_DEVICE", 2,  # K = 2 micro-batches: AGVM's two estimates
    "SOLVER.AGVM.ENABLED", True,
    "SOLVER.AGVM.GROUPS", (("backbone", "conv"), ("backbone", "norm"), ("head", "head")),
    "SOLVER.AGVM.PERIOD", 1, "SOLVER.AGVM.START_ITER", 0, "SOLVER.AGVM.MOMENTUM", 0.5,
]  # fmt: skip


def test_rollback_after_an_infinite_gradient_restores_the_whole_training_state(
    tiny_shapes, tmp_path
):
    record = Record()
    trainer = run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, *AGVM_OPTS,
                  at=-1, extra_hooks=[InfiniteGradientAt(3), record])  # fmt: skip
    assert [step["iter"] for step in record.steps] == [0, 1, 2, 3, 2, 3, 4, 5]
    assert trainer.iter == 6
    for step in record.steps:
        assert all(torch.isfinite(v).all() for v in step["weights"].values()), step["iter"]
    assert_finite_checkpoints(tmp_path)

    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=False)
    state, after = saved["trainer"], record.steps[4]  # the first step after the rollback
    assert all(torch.equal(after["weights"][k], saved["model"][k]) for k in saved["model"])
    # the optimizer's state (momentum buffers) and param groups, the LR lowered by 0.5
    optimizer = state["_trainer"]["optimizer"]
    assert after["optimizer"]["state"].keys() == optimizer["state"].keys()
    for index, buffers in optimizer["state"].items():
        restored = after["optimizer"]["state"][index]["momentum_buffer"]
        assert torch.equal(restored, buffers["momentum_buffer"])
    assert [g["lr"] for g in after["optimizer"]["param_groups"]] == pytest.approx(
        [0.5 * g["lr"] for g in optimizer["param_groups"]]
    )
    # the LR scheduler: its position (iteration 2) and its base LRs, lowered
    scheduler = state["hooks"]["LRScheduler"]
    assert after["scheduler"]["last_epoch"] == scheduler["last_epoch"] == 2
    lowered = [0.5 * lr for lr in scheduler["base_lrs"]]
    assert after["scheduler"]["base_lrs"] == pytest.approx(lowered)
    # AGVM's mu: moved by iteration 2's estimate before the divergence, restored after it
    assert after["mu"] == state["_trainer"]["agvm"]["mu"] != record.steps[3]["mu"]
    # 2 in the checkpoint (iterations 0, 1), then 2 ... 5; without the restore it would be 7
    assert trainer.loop.agvm.num_estimates == 6


def test_rollback_without_a_checkpoint_stops(tiny_shapes, tmp_path):
    with pytest.raises(
        FloatingPointError, match=r"Last good checkpoint: none \(nothing to roll back to\)"
    ):
        run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, at=0)


def test_after_a_rollback_metrics_json_holds_each_step_once_with_the_values_that_stand(
    tiny_shapes, tmp_path
):
    # NaN at iteration 3, back to model_0000001: steps 2 and 3 are trained again. Written
    # every step, metrics.json holds them once, with the redone steps' finite values; the
    # median windows (LOG_PERIOD 1 still smooths the losses over 20 values) hold no NaN.
    record = RecordLosses()
    trainer = run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, "LOG_PERIOD", 1, extra_hooks=[record])
    assert trainer.iter == 6
    with open(tmp_path / "metrics.json") as f:
        records = [json.loads(line) for line in f if '"iteration"' in line]
    steps = [r for r in records if "total_loss" in r]
    assert [r["iteration"] for r in steps] == [0, 1, 2, 3, 4, 5]
    assert all(math.isfinite(r["total_loss"]) for r in steps)
    # the values written are the steps that stand: recomputed from the losses the redone
    # steps reported (the console's smoothing: the median of the last up to 20 values)
    standing = {}
    for it, loss in record.losses:
        standing[it] = loss
    for r in steps:
        window = [standing[i] for i in range(max(0, r["iteration"] - 19), r["iteration"] + 1)]
        assert r["total_loss"] == pytest.approx(statistics.median(window), rel=1e-6)
    history = trainer.storage.history("total_loss").values()
    assert [step for _, step in history] == [0, 1, 2, 3, 4, 5]


class RecordLosses(HookBase):
    """(iteration, total loss) after every step, as the trainer reports it; a step undone by
    the rollback is recorded before the guard undoes it, and left out (this hook runs after
    the guard, which then skips it)."""

    def __init__(self):
        self.losses = []

    def after_step(self):
        self.losses.append((self.trainer.iter, float(self.trainer.loop.last_total_loss)))


class NanLossAt(HookBase):
    """A NaN loss in the first ``times`` runs of iteration ``at``."""

    def __init__(self, at, times):
        self.at, self.left = at, times

    def before_step(self):
        fire = self.trainer.iter == self.at and self.left > 0
        self.left -= fire
        self.trainer.model.loss_scale = math.nan if fire else 1.0


def test_a_rollback_that_diverges_again_goes_back_further(tiny_shapes, tmp_path):
    """Diverging again before a checkpoint past the one restored: those weights led to the
    divergence, so the next rollback restores the checkpoint before them."""
    record = Record()
    seed_all_rng(0)
    trainer = Trainer(tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 8, "SOLVER.CHECKPOINT_PERIOD", 2,
                               "SOLVER.DIVERGENCE.ROLLBACK", True))  # fmt: skip
    trainer.register_hooks([NanLossAt(5, times=2), record])
    trainer.train()
    # NaN at 5: back to model_0000003; NaN at 5 again: back to model_0000001, not to 3 again
    assert [step["iter"] for step in record.steps] == [0, 1, 2, 3, 4, 5, 4, 5, 2, 3, 4, 5, 6, 7]
    final = torch.load(tmp_path / "model_final.pth", weights_only=True)["trainer"]["hooks"]
    assert final["DivergenceGuard"]["rollbacks"] == 2


def test_a_rollback_that_diverges_again_with_nothing_earlier_stops(tiny_shapes, tmp_path):
    with pytest.raises(FloatingPointError, match=r"model_0000001\.pth, restored by the last rollback, diverged again"):
        trainer = Trainer(tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 6, "SOLVER.CHECKPOINT_PERIOD", 2,
                                   "SOLVER.DIVERGENCE.ROLLBACK", True))  # fmt: skip
        trainer.register_hooks([NanLossAt(3, times=2)])
        trainer.train()


def test_the_spike_test_watches_the_first_steps():
    """With the default window of 50, a spike at step 6 is caught: the test starts after
    MIN_SPIKE_HISTORY steps, with the median of those seen."""
    from largedet.engine.hooks import MIN_SPIKE_HISTORY

    guard = DivergenceGuard()
    guard.history.extend([4.0, 3.0, 2.0, 2.0])
    assert guard.check(1e3) == ""  # 4 steps seen: not yet
    guard.history.append(1.5)
    assert MIN_SPIKE_HISTORY == 5 and guard.check(1e3) == "loss 1000 > 10 x 2, the median of the last 5 steps"
