"""AccumulationTrainer: K micro-batches of B give the gradient of one batch of K*B; AMP."""

import pytest
import torch
from engine_testing import synthetic_batch, tiny_cfg

import largedet  # noqa: F401
from detectron2.engine import HookBase
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from largedet.engine import AccumulationTrainer


class CaptureGrads(HookBase):
    """Keeps a copy of every gradient as ``after_backward`` sees it."""

    def after_backward(self):
        self.grads = {n: p.grad.detach().clone() for n, p in self.trainer.model.named_parameters()}


def tiny_model(norm):
    torch.manual_seed(0)
    return build_model(tiny_cfg("", "MODEL.RESNETS.NORM", norm))


def one_step(model, batches, k, **kwargs):
    """Run one AccumulationTrainer step over ``batches`` (K of them); returns it and the grads."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = AccumulationTrainer(model, batches, optimizer, k, **kwargs)
    capture = CaptureGrads()
    trainer.register_hooks([capture])
    with EventStorage(0) as trainer.storage:
        trainer.run_step()
    return trainer, capture.grads


def assert_grads_close(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("norm", ["GN", "FrozenBN"])
def test_three_micro_batches_of_two_equal_one_batch_of_six(norm):
    data = synthetic_batch(6, seed=1)
    micro, grads_micro = one_step(tiny_model(norm), [data[0:2], data[2:4], data[4:6]], 3)
    big, grads_big = one_step(tiny_model(norm), [data], 1)
    assert_grads_close(grads_micro, grads_big, atol=1e-6)
    # the logged losses are the micro-batch means averaged: the big batch's losses
    assert micro.last_losses.keys() == {"loss_box", "loss_cls"}
    for name, value in big.last_losses.items():
        assert micro.last_losses[name] == pytest.approx(value, abs=1e-6)
    assert micro.last_total_loss == pytest.approx(sum(big.last_losses.values()), abs=1e-6)
    assert micro.storage.latest()["total_loss"][0] == pytest.approx(micro.last_total_loss)


def test_batch_norm_statistics_break_the_equivalence():
    # the same comparison with trainable BN (statistics over 2 vs 6 images) must differ:
    # the test above is able to see a difference
    data = synthetic_batch(6, seed=1)
    _, grads_micro = one_step(tiny_model("BN"), [data[0:2], data[2:4], data[4:6]], 3)
    _, grads_big = one_step(tiny_model("BN"), [data], 1)
    assert max((grads_micro[n] - grads_big[n]).abs().max().item() for n in grads_big) > 1e-4


def reference_amp_grads(model, micro_batches, dtype):
    """Gradient of the mean micro-batch loss, each forward under autocast, summed in fp32."""
    model.zero_grad()
    for batch in micro_batches:
        with torch.autocast("cpu", dtype=dtype):
            loss = sum(model(batch).values())
        (loss / len(micro_batches)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_bfloat16_autocast_with_accumulation():
    data = synthetic_batch(6, seed=2)
    micro = [data[0:2], data[2:4], data[4:6]]
    model = tiny_model("GN")
    dtypes = []
    handle = model.conv1.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    trainer, grads = one_step(model, micro, 3, amp_dtype=torch.bfloat16)
    handle.remove()
    assert dtypes == [torch.bfloat16] * 3  # every micro-batch ran under autocast
    assert trainer.grad_scaler is None
    assert all(g.dtype == torch.float32 for g in grads.values())
    expected = reference_amp_grads(tiny_model("GN"), micro, torch.bfloat16)
    assert_grads_close(grads, expected, atol=1e-6)
    # and bf16 stays near full precision
    _, full = one_step(tiny_model("GN"), [data], 1)
    for name in full:
        torch.testing.assert_close(grads[name], full[name], rtol=0.1, atol=2e-2, msg=name)


def test_float16_grad_scaler_unscales_once_per_step_before_the_optimizer():
    data = synthetic_batch(6, seed=3)
    micro = [data[0:2], data[2:4], data[4:6]]
    model = tiny_model("GN")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    events = []
    unscale = scaler.unscale_
    scaler.unscale_ = lambda opt: (events.append("unscale"), unscale(opt))[1]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    step = optimizer.step
    seen_at_step = {}

    def recording_step(*args, **kwargs):
        events.append("step")
        seen_at_step.update({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        return step(*args, **kwargs)

    optimizer.step = recording_step
    trainer = AccumulationTrainer(
        model, micro, optimizer, 3, amp_dtype=torch.float16, grad_scaler=scaler
    )
    capture = CaptureGrads()
    trainer.register_hooks([capture])
    with EventStorage(0) as trainer.storage:
        trainer.run_step()
    assert events == ["unscale", "step"]
    assert trainer.storage.latest()["grad_scaler"][0] == 2.0**10
    # hooks and the optimizer see unscaled gradients: those of the unscaled fp16 computation
    expected = reference_amp_grads(tiny_model("GN"), micro, torch.float16)
    for name in expected:
        torch.testing.assert_close(
            capture.grads[name], expected[name], rtol=1e-3, atol=1e-5, msg=name
        )
        assert torch.equal(seen_at_step[name], capture.grads[name])


def test_float16_creates_its_grad_scaler_and_checkpoints_it():
    model = tiny_model("GN")
    trainer = AccumulationTrainer(
        model, [], torch.optim.SGD(model.parameters(), lr=0.1), 2, amp_dtype=torch.float16
    )
    assert isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    state = trainer.state_dict()
    assert state["grad_scaler"]["scale"] == 2.0**16
    with pytest.raises(ValueError, match="accumulation_steps"):
        AccumulationTrainer(model, [], torch.optim.SGD(model.parameters(), lr=0.1), 0)


def test_warmup_clip_bounds_the_gradient_norm_in_its_window_only(tiny_shapes, tmp_path):
    # SGD without momentum or weight decay: the update is -lr x the (clipped) gradient. Clip to
    # 0.05 from 1 step before to 1 after the end of warm-up (step 2): steps 1 and 2 only.
    from detectron2.engine import HookBase

    from largedet.engine import Trainer
    from engine_testing import tiny_cfg, weights

    class Record(HookBase):
        def __init__(self):
            self.rows = []

        def before_step(self):
            self._before = weights(self.trainer.model)
            self._lr = self.trainer.optimizer.param_groups[0]["lr"]

        def after_step(self):
            after = weights(self.trainer.model)
            step = torch.sqrt(sum(((after[k] - self._before[k]) ** 2).sum() for k in after
                                  if k.endswith(("weight", "bias")) and "norm2" not in k))  # fmt: skip
            self.rows.append((self.trainer.iter, float(step) / self._lr, self.trainer.loop.last_grad_norm))

    cfg = tiny_cfg(str(tmp_path), "SOLVER.MOMENTUM", 0.0, "SOLVER.WEIGHT_DECAY", 0.0, "SOLVER.MAX_ITER", 4,
                   "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_CLIP.MAX_NORM", 0.05, "SOLVER.WARMUP_CLIP.ITERS", (1, 1))  # fmt: skip
    trainer = Trainer(cfg)
    record = Record()
    trainer.register_hooks([record])
    trainer.train()
    for iteration, update_norm, grad_norm in record.rows:
        assert grad_norm > 0.05  # every step's gradient is larger than the bound
        expected = 0.05 if iteration in (1, 2) else grad_norm
        assert update_norm == pytest.approx(expected, rel=1e-4), iteration


def test_one_named_message_in_the_steps_one_collective(monkeypatch):
    """The per-step sync is one all-gather of a StepSync (losses and gradient norm, data
    time, stop request), whatever K is."""
    from detectron2.utils import comm

    from largedet.engine.train_loop import StepSync

    sent = []

    def all_gather(data, group=None):
        sent.append(data)
        return [data]

    monkeypatch.setattr(comm, "all_gather", all_gather)
    data = synthetic_batch(4, seed=3)
    model = tiny_model("GN")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = AccumulationTrainer(model, [data[0:2], data[2:4]], optimizer, 2)
    trainer.request_stop(15)
    with EventStorage(0) as trainer.storage:
        trainer.run_step()
    (sync,) = sent
    assert isinstance(sync, StepSync) and sync.stop_request == 15 and sync.data_time >= 0
    assert sync.metrics[:2] == pytest.approx([trainer.last_losses["loss_box"], trainer.last_losses["loss_cls"]])
    assert sync.metrics[-1] == pytest.approx(trainer.last_grad_norm)
    assert trainer.stop_agreed and trainer.stop_signals == [15]
