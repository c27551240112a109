"""AccumulationTrainer on CUDA under AMP: K = 4 micro-batches give the gradient of one
batch 4x larger, with float16 (and its gradient scaler) and with bfloat16."""

import pytest
import torch
from engine_testing import synthetic_batch, tiny_cfg

import largedet  # noqa: F401
from detectron2.engine import HookBase
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from largedet.engine import AccumulationTrainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

K = 4
MICRO = 2  # images per micro-batch; the K = 1 batch holds K * MICRO = 8
SCALE = 2.0**10  # the float16 runs' loss scale: small enough not to overflow here

# Per parameter: ||g_K4 - g_K1|| <= RTOL * ||g_K1|| + ATOL. Under autocast each micro-batch's
# weight gradient is rounded to the AMP dtype before the four are summed in fp32, where the
# K = 1 batch rounds its total once; activations may also round differently when cuDNN picks
# another algorithm for another batch size. That is a few units of the dtype's rounding
# (float16: 2^-11 = 4.9e-4; bfloat16: 2^-8 = 3.9e-3) per element, times the cancellation
# between micro-batches; 20x the unit is allowed. A dropped 1/K (4x), a micro-batch counted
# twice (+25%) or a loss scale left in (1024x) is far outside.
RTOL = {torch.float16: 1e-2, torch.bfloat16: 8e-2}
ATOL = 1e-6  # for parameters whose gradient is ~0
# The AMP gradient against full precision at K = 1: each of the tiny detector's few layers
# rounds to the AMP dtype forward and backward (measured with CPU autocast: up to 0.5%
# for float16, 3.5% for bfloat16, on conv1's weight); about 7x that is allowed. A gradient
# off by a factor of 2 or more (a scale applied twice, or not removed) is still outside.
RTOL_FULL = {torch.float16: 5e-2, torch.bfloat16: 2.5e-1}


class CaptureGrads(HookBase):
    """A copy of every gradient as ``after_backward`` sees it (unscaled, before the step)."""

    def after_backward(self):
        self.grads = {n: p.grad.detach().clone() for n, p in self.trainer.model.named_parameters()}


def tiny_model():
    """The engine tests' detector on the GPU: GN, so no batch statistics; per-image losses
    averaged over the batch."""
    torch.manual_seed(0)
    return build_model(tiny_cfg("", "MODEL.DEVICE", "cuda", "MODEL.RESNETS.NORM", "GN"))


def one_step(batches, k, amp_dtype, grad_scaler=None):
    """One AccumulationTrainer step over ``batches``; returns the trainer, the gradients
    the hooks saw and the dtype of conv1's output in each forward pass."""
    model = tiny_model()
    dtypes = []
    handle = model.conv1.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = AccumulationTrainer(
        model, batches, optimizer, k, amp_dtype=amp_dtype, grad_scaler=grad_scaler
    )
    capture = CaptureGrads()
    trainer.register_hooks([capture])
    with EventStorage(0) as trainer.storage:
        trainer.run_step()
    handle.remove()
    return trainer, capture.grads, dtypes


def assert_grads_close(actual, expected, rtol):
    assert actual.keys() == expected.keys()
    for name, g in expected.items():
        err = (actual[name] - g).norm().item()
        assert err <= rtol * g.norm().item() + ATOL, (name, err, g.norm().item())


def scaler(amp_dtype):
    return torch.amp.GradScaler("cuda", init_scale=SCALE) if amp_dtype == torch.float16 else None


@pytest.mark.parametrize("amp_dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_four_micro_batches_equal_one_batch_four_times_larger(amp_dtype):
    data = synthetic_batch(K * MICRO, seed=1)
    micro = [data[i * MICRO : (i + 1) * MICRO] for i in range(K)]
    acc, grads_acc, dtypes_acc = one_step(micro, K, amp_dtype, scaler(amp_dtype))
    big, grads_big, dtypes_big = one_step([data], 1, amp_dtype, scaler(amp_dtype))

    # every forward pass ran under autocast; gradients stay fp32 on the GPU, finite
    assert dtypes_acc == [amp_dtype] * K and dtypes_big == [amp_dtype]
    for grads in (grads_acc, grads_big):
        assert all(g.dtype == torch.float32 and g.is_cuda for g in grads.values())
        assert all(torch.isfinite(g).all() for g in grads.values())
        assert sum(g.abs().sum().item() for g in grads.values()) > 0
    if amp_dtype == torch.float16:
        # the hooks saw unscaled gradients (checked by the comparison below) and no step
        # overflowed: GradScaler.update() halves the scale after an overflow
        assert acc.grad_scaler.get_scale() == big.grad_scaler.get_scale() == SCALE
        assert acc.storage.latest()["grad_scaler"][0] == SCALE
    else:
        assert acc.grad_scaler is None and big.grad_scaler is None

    assert_grads_close(grads_acc, grads_big, RTOL[amp_dtype])
    # the logged losses: the mean over micro-batches is the big batch's mean
    assert acc.last_losses.keys() == big.last_losses.keys() == {"loss_box", "loss_cls"}
    for name, value in big.last_losses.items():
        assert acc.last_losses[name] == pytest.approx(value, rel=RTOL[amp_dtype])

    _, grads_full, dtypes_full = one_step([data], 1, None)
    assert dtypes_full == [torch.float32]
    assert_grads_close(grads_big, grads_full, RTOL_FULL[amp_dtype])


def test_float16_default_grad_scaler_runs_on_cuda():
    """Without a scaler given, the trainer makes a CUDA one (init scale 2^16); a step with
    it leaves finite weights and a scale of 2^16 (no overflow) or 2^15 (one skipped step)."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = synthetic_batch(K * MICRO, seed=2)
    micro = [data[i * MICRO : (i + 1) * MICRO] for i in range(K)]
    trainer = AccumulationTrainer(model, micro, optimizer, K, amp_dtype=torch.float16)
    assert trainer.device_type == "cuda" and isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    with EventStorage(0) as trainer.storage:
        trainer.run_step()
    assert trainer.grad_scaler.get_scale() in (2.0**16, 2.0**15)
    assert all(torch.isfinite(p).all() for p in model.parameters())
