"""The batch ramp (SOLVER.BATCH_RAMP): its step arithmetic, the one-line errors before
launch, the trainer's K, LR, data position and PMD clock at each step against hand
computations, and a bit-exact resume in the middle of the ramp."""

import math

import pytest
import torch
from detectron2.engine import HookBase
from detectron2.utils.env import seed_all_rng
from engine_testing import StopAt, tiny_cfg, weights

from largedet.engine import Trainer
from largedet.solver.batch import BatchArithmeticError, BatchPlan, batch_plan, batch_schedule
from largedet.optim import PMDLAMB


def test_schedule_steps_images_and_clock():
    # 160 images (10 steps of 16); 4-image steps to 12 images (0.5 epoch of 24), 8-image
    # steps to 24, then 16-image steps until 160 images are reached
    plan = BatchPlan(16, 1, 2, 8)
    s = batch_schedule(plan, 10, (4, 8), (0.5, 1.0), dataset_size=24)
    assert [(st.batch, st.accumulation, st.first_step, st.steps, st.first_image) for st in s.stages] == [
        (4, 2, 0, 3, 0), (8, 4, 3, 2, 12), (16, 8, 5, 9, 28)]  # fmt: skip
    assert s.total_steps == 14 and s.total_images == 160 and s.ramped
    assert [s.batch_at(t) for t in range(14)] == [4] * 3 + [8] * 2 + [16] * 9
    assert [s.images_before(t) for t in (0, 1, 3, 5, 6, 14)] == [0, 4, 12, 28, 44, 172]
    assert s.clock(5) == 28 / 16
    # without a ramp: one stage, MAX_ITER steps
    plain = batch_schedule(plan, 10)
    assert not plain.ramped and plain.total_steps == 10 and plain.batch_at(9) == 16


def _plan_errors(*opts, world=1):
    cfg = tiny_cfg("/tmp/unused", "SOLVER.IMS_PER_BATCH", 16, "SOLVER.IMS_PER_DEVICE", 2, *opts)
    with pytest.raises(BatchArithmeticError) as e:
        batch_plan(cfg, world)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_ramp_that_cannot_run_is_a_one_line_error():
    message = _plan_errors("SOLVER.BATCH_RAMP.BATCHES", (6,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,), world=2)
    assert "SOLVER.BATCH_RAMP.BATCHES: 6 is not a whole multiple of world size 2 x SOLVER.IMS_PER_DEVICE 2 = 4" in message
    assert "below SOLVER.IMS_PER_BATCH" in _plan_errors(
        "SOLVER.BATCH_RAMP.BATCHES", (16,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,))  # fmt: skip
    assert "one entry per stage" in _plan_errors("SOLVER.BATCH_RAMP.BATCHES", (4,))
    assert "increasing order" in _plan_errors(
        "SOLVER.BATCH_RAMP.BATCHES", (4, 8), "SOLVER.BATCH_RAMP.EPOCHS", (2.0, 1.0))  # fmt: skip
    assert "needs SOLVER.IMS_PER_DEVICE > 0" in _plan_errors(
        "SOLVER.IMS_PER_DEVICE", 0, "SOLVER.BATCH_RAMP.BATCHES", (4,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,))  # fmt: skip
    with pytest.raises(BatchArithmeticError, match="not before the run's end"):
        batch_schedule(BatchPlan(16, 1, 2, 8), 2, (4,), (2.0,), dataset_size=16)


class Record(HookBase):
    """K, the LR, the PMD clock and the data position of every step."""

    def __init__(self):
        self.rows = []

    def before_step(self):
        self._lr = self.trainer.optimizer.param_groups[0]["lr"]  # the LR hook sets it after a step

    def after_step(self):
        k = self.trainer.loop.accumulation_steps
        self.rows.append((k, self._lr, self.trainer.optimizer.clock, self.trainer.data.position))


# tiny_shapes: 24 training images. Batch 8 in micro-batches of 2; 6 steps of 8 = 48 images.
# Ramp: batch 4 until 0.5 epoch (12 images: 3 steps), then 8 until 48 images (5 steps).
RAMP = ("SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 6,
        "SOLVER.BATCH_RAMP.BATCHES", (4,), "SOLVER.BATCH_RAMP.EPOCHS", (0.5,))  # fmt: skip


def test_trainer_follows_the_ramp(tiny_shapes, tmp_path):
    opts = [*RAMP, "SOLVER.OPTIMIZER", "PMD_LAMB", "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.RULE", "sqrt",
            "SOLVER.LSR.REFERENCE_BATCH", 2, "SOLVER.LSR.REFERENCE_LR", 0.01, "SOLVER.PMD.PERIOD", 3]  # fmt: skip
    trainer = Trainer(tiny_cfg(str(tmp_path), *opts))
    record = Record()
    trainer.register_hooks([record])
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert trainer.max_iter == 8
    images = [0, 4, 8, 12, 20, 28, 36, 44]  # before each step
    batches = [4, 4, 4, 8, 8, 8, 8, 8]
    peak = 0.01 * math.sqrt(8 / 2)
    expected = []
    for seen, b in zip(images, batches):
        where = seen / 48  # warm-up: 2 steps of 8 = 16 images, from 0.5 x, linear
        warmup = 0.5 * (1 - where / (16 / 48)) + where / (16 / 48) if where < 16 / 48 else 1.0
        expected.append(peak * warmup * math.sqrt(b / 8))
    assert [r[0] for r in record.rows] == [2, 2, 2, 4, 4, 4, 4, 4]  # K
    assert [r[1] for r in record.rows] == pytest.approx(expected, rel=1e-12)
    assert [r[2] for r in record.rows] == [seen / 8 for seen in images]  # PMD's clock
    assert [r[3] for r in record.rows] == [seen + b for seen, b in zip(images, batches)]
    assert trainer.data.position == 52


def test_moment_clock_sets_the_period_position():
    # gamma of step 2 from the clock: cosine decay at u = (clock mod T) / T
    def second_step_weight(clock):
        p = torch.nn.Parameter(torch.ones(3))
        opt = PMDLAMB([p], lr=0.1, period=4, decay="cosine")
        for _ in range(2):
            p.grad = torch.full((3,), 0.5)
            opt.set_clock(clock)
            opt.step()
        return opt.state[p]["exp_avg_weight"]

    beta1 = 0.9
    for clock in (None, 1.0, 2.0, 6.5):
        position = 1 if clock is None else clock
        gamma = (1 + math.cos(math.pi * (position % 4) / 4)) / 2
        assert second_step_weight(clock) == pytest.approx(gamma * beta1 * (1 - beta1) + (1 - beta1), rel=1e-15)


def test_resume_in_the_middle_of_the_ramp_is_bit_exact(tiny_shapes, tmp_path):
    opts = [*RAMP, "SOLVER.CHECKPOINT_PERIOD", 2, "RESEED_EVERY_ITER", True]
    seed_all_rng(0)
    straight = Trainer(tiny_cfg(str(tmp_path / "straight"), *opts))
    straight.resume_or_load(resume=False)
    straight.train()

    out = tmp_path / "killed"
    seed_all_rng(0)
    first = Trainer(tiny_cfg(str(out), *opts))
    first.register_hooks([StopAt(3)])  # checkpoint after step 1: step 2 is still at batch 4
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    assert (out / "last_checkpoint").read_text() == "model_0000001.pth"

    seed_all_rng(1)
    resumed = Trainer(tiny_cfg(str(out), *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2 and resumed.data.position == 8
    resumed.train()
    final, reference = weights(resumed.model), weights(straight.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []
    assert resumed.data.position == straight.data.position == 52


def test_the_eta_of_a_ramp_counts_images_left():
    from detectron2.utils.events import CommonMetricPrinter, EventStorage

    from largedet.engine.writers import ImageClockPrinter

    # the schedule of test_schedule_steps_images_and_clock: steps of 4, 4, 4, 8, 8, then 16
    # x 9 (172 images); a step takes 0.01 s per image, so the steps of 4 take 0.04 s
    s = batch_schedule(BatchPlan(16, 1, 2, 8), 10, (4, 8), (0.5, 1.0), dataset_size=24)
    printer = ImageClockPrinter(s)
    times = [(0.01 * s.batch_at(t), t) for t in range(4)]  # steps 0-3 have run
    # images left after step 3: 172 - 20 = 152, at 0.01 s each
    assert printer.eta_seconds(3, times) == pytest.approx(1.52, rel=1e-12)
    # Detectron2's estimate, the median step time x steps left, says 0.04 x 10 = 0.40 s
    with EventStorage(start_iter=3) as storage:
        for seconds, step in times:
            storage.iter = step
            storage.put_scalar("time", seconds)
        assert CommonMetricPrinter(s.total_steps)._get_eta(storage) == "0:00:00"
        assert storage.history("eta_seconds").latest() == pytest.approx(0.40, rel=1e-12)
        assert printer._get_eta(storage) == "0:00:01"
        assert storage.history("eta_seconds").latest() == pytest.approx(1.52, rel=1e-12)
    # after the last step nothing is left
    assert printer.eta_seconds(13, times) == 0.0


def test_only_a_ramped_run_swaps_the_console_writer(tiny_shapes, tmp_path):
    from detectron2.utils.events import CommonMetricPrinter

    from largedet.engine.writers import ImageClockPrinter

    ramped = Trainer(tiny_cfg(str(tmp_path / "ramp"), *RAMP)).build_writers()
    plain = Trainer(tiny_cfg(str(tmp_path / "plain"), *RAMP[:6])).build_writers()
    assert [type(w) for w in ramped][0] is ImageClockPrinter and ramped[0]._max_iter == 8
    assert type(plain[0]) is CommonMetricPrinter and not any(isinstance(w, ImageClockPrinter) for w in plain)
