"""The divergence guard: when a step diverges, and what the run then does."""

import math
import os

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


class ScaleLossAt(HookBase):
    """Multiplies the model's losses by ``factor`` during iteration ``at`` only."""

    def __init__(self, at, factor):
        self.at, self.factor = at, factor

    def before_step(self):
        self.trainer.model.loss_scale = self.factor if self.trainer.iter == self.at else 1.0


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


class Observe(HookBase):
    """Weights and LR at the start of iteration ``at``."""

    def __init__(self, at):
        self.at = at

    def before_step(self):
        if self.trainer.iter == self.at:
            self.weights = weights(self.trainer.model)
            self.lr = self.trainer.optimizer.param_groups[0]["lr"]


def test_rollback_restores_the_last_good_checkpoint_and_lowers_the_lr(tiny_shapes, tmp_path):
    observe = Observe(4)
    trainer = run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, "SOLVER.DIVERGENCE.ROLLBACK_LR_FACTOR", 0.25,
                  extra_hooks=[observe])  # fmt: skip
    assert trainer.iter == 6  # the run went on to the end
    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=False)
    assert all(torch.equal(observe.weights[k], saved["model"][k]) for k in saved["model"])
    assert observe.lr == pytest.approx(0.1 * 0.25)  # after warmup the schedule is at BASE_LR 0.1
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.025, 0.025])
    final = torch.load(tmp_path / "model_final.pth", weights_only=False)["trainer"]["hooks"]
    assert final["DivergenceGuard"]["rollbacks"] == 1
    assert final["LRScheduler"]["base_lrs"] == pytest.approx([0.025, 0.025])


def test_rollback_without_a_checkpoint_stops(tiny_shapes, tmp_path):
    with pytest.raises(
        FloatingPointError, match=r"Last good checkpoint: none \(nothing to roll back to\)"
    ):
        run(tmp_path, "SOLVER.DIVERGENCE.ROLLBACK", True, at=0)
