"""A step whose gradient is not finite is skipped, found by one fused reduction per step."""

import copy
import logging
import math

import pytest
import torch
from engine_testing import largedet_log, synthetic_batch, tiny_cfg, weights
from torch import nn

import largedet  # noqa: F401
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from largedet.engine import AccumulationTrainer
from largedet.engine.train_loop import total_norm
from largedet.solver import build_agvm, build_optimizer


def test_total_norm_is_the_norm_of_all_values_in_float32():
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(5, 3, generator=g),
        torch.randn(7, generator=g).double(),
        torch.randn(4, 4, generator=g).half(),
        torch.randn(2, generator=g).bfloat16(),
        torch.randn(3, generator=g),
    ]
    reference = torch.cat([t.double().flatten() for t in tensors]).norm()
    norm = total_norm(tensors)
    assert norm.dtype == torch.float32 and norm.shape == ()
    assert norm.item() == pytest.approx(reference.item(), rel=1e-6)
    # float16 values whose squares overflow float16 are still finite
    assert total_norm([torch.full((10,), 6e4, dtype=torch.float16)]).item() == pytest.approx(
        6e4 * math.sqrt(10), rel=1e-3
    )
    assert total_norm([]).item() == 0.0
    for bad in (math.inf, -math.inf, math.nan):
        broken = [t.clone() for t in tensors]
        broken[2][1, 1] = bad
        assert not math.isfinite(total_norm(broken).item())


AGVM_OPTS = [
    "SOLVER.AGVM.ENABLED", True,
    "SOLVER.AGVM.GROUPS", (("backbone", "conv"), ("backbone", "norm"), ("head", "head")),
    "SOLVER.AGVM.PERIOD", 1, "SOLVER.AGVM.START_ITER", 0,
]  # fmt: skip


def test_a_step_with_an_infinite_gradient_changes_nothing(caplog):
    cfg = tiny_cfg("", *AGVM_OPTS)
    data = synthetic_batch(8, seed=4)
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    agvm = build_agvm(cfg, optimizer)
    trainer = AccumulationTrainer(model, [data[:4], data[4:]] * 4, optimizer, 2, agvm=agvm)
    with EventStorage(0):
        for trainer.iter in range(2):  # two good steps: momentum buffers, mu != 1
            trainer.run_step()
        assert math.isfinite(trainer.last_grad_norm) and trainer.last_grad_norm > 0
        before = (weights(model), copy.deepcopy(optimizer.state_dict()), dict(agvm.mu))
        assert agvm.mu["head"] != 1.0
        handle = model.head.weight.register_hook(lambda g: torch.full_like(g, math.inf))
        trainer.iter = 2
        with largedet_log(caplog):
            trainer.run_step()
        handle.remove()
    assert trainer.last_grad_norm == math.inf and math.isfinite(trainer.last_total_loss)
    after = weights(model)
    assert all(torch.equal(after[k], before[0][k]) for k in after)
    state = optimizer.state_dict()["state"]
    assert all(
        torch.equal(state[i]["momentum_buffer"], s["momentum_buffer"])
        for i, s in before[1]["state"].items()
    )
    assert agvm.mu == before[2] and agvm.num_estimates == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Iteration 2: the gradient's norm is inf (losses {trainer.last_losses}): "
        "optimizer step skipped"
    ]


def test_with_float16_the_gradient_scaler_skips_the_step_and_lowers_its_scale(caplog):
    cfg = tiny_cfg("", *AGVM_OPTS)
    data = synthetic_batch(8, seed=4)
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    agvm = build_agvm(cfg, optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer = AccumulationTrainer(
        model, [data[:4], data[4:]], optimizer, 2, agvm=agvm, amp_dtype=torch.float16,
        grad_scaler=scaler,
    )  # fmt: skip
    before = weights(model)
    model.head.bias.register_hook(lambda g: torch.full_like(g, math.inf))
    with EventStorage(0), largedet_log(caplog):
        trainer.run_step()
    assert trainer.last_grad_norm == math.inf and scaler.get_scale() == 2.0**9
    after = weights(model)
    assert all(torch.equal(after[k], before[k]) for k in after)
    assert agvm.num_estimates == 0 and set(agvm.mu.values()) == {1.0}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # fp16 as usual


class Chain(nn.Module):
    """``n`` linear layers; the loss is the mean square of the output."""

    def __init__(self, n):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])

    def forward(self, x):
        return {"loss": self.layers(x).pow(2).mean()}


def count_host_syncs_and_foreach_norms(monkeypatch, n_layers, inf_gradient):
    """Host reads of tensor values (item, tolist, bool, float, int) and
    ``torch._foreach_norm`` calls in one step of a model with ``n_layers`` layers."""
    torch.manual_seed(0)
    model = Chain(n_layers)
    trainer = AccumulationTrainer(
        model, [torch.randn(3, 4)] * 2, torch.optim.SGD(model.parameters(), lr=0.1), 1
    )
    if inf_gradient:
        model.layers[0].bias.register_hook(lambda g: torch.full_like(g, math.inf))
    counts = {"sync": 0, "foreach_norm": 0}

    def counting(fn, key):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    with EventStorage(0):
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name), "sync"))
        monkeypatch.setattr(torch, "_foreach_norm", counting(torch._foreach_norm, "foreach_norm"))
        trainer.run_step()
        monkeypatch.undo()
    assert math.isfinite(trainer.last_grad_norm) != inf_gradient
    return counts


@pytest.mark.parametrize("inf_gradient", [False, True])
def test_the_check_is_one_fused_reduction_read_with_the_losses(monkeypatch, inf_gradient):
    small = count_host_syncs_and_foreach_norms(monkeypatch, 2, inf_gradient)
    large = count_host_syncs_and_foreach_norms(monkeypatch, 40, inf_gradient)
    # one foreach norm over all gradients and one host read (losses and norm together),
    # whatever the number of parameters
    assert small == large == {"sync": 1, "foreach_norm": 1}
