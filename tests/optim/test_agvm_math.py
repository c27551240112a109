"""AGVM's math: phi on gradients of known cosine, mu with its clamp and moving average,
the preconditioned comparison for adaptive optimizers, the LR it applies, its state."""

import math

import pytest
import torch
from torch import nn

from largedet.optim import AGVM, PART_KEY, PMDLAMB, gradient_variance, modulation
from largedet.optim.agvm import PartStatistics, precondition


def with_cosine(cos, d, seed=0, scale_b=1.0):
    """Two float64 vectors with cosine ``cos`` (and norms 1 and ``scale_b``)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g, dtype=torch.float64)
    u /= u.norm()
    w = torch.randn(d, generator=g, dtype=torch.float64)
    w -= (w @ u) * u
    w /= w.norm()
    return u, (cos * u + math.sqrt(1 - cos**2) * w) * scale_b


def two_part_optimizer(opt="sgd"):
    """Parts "backbone" (two groups: conv weight, conv bias) and "head" (one group)."""
    model = nn.ModuleDict({"conv": nn.Conv2d(2, 3, 3), "head": nn.Linear(3, 2)}).double()
    groups = [
        {"params": [model["conv"].weight], PART_KEY: "backbone"},
        {"params": [model["conv"].bias], PART_KEY: "backbone", "weight_decay": 0.0},
        {"params": list(model["head"].parameters()), PART_KEY: "head"},
    ]
    if opt == "sgd":
        return model, torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    if opt == "adamw":
        return model, torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.99), eps=1e-3)
    return model, PMDLAMB(groups, lr=0.01, betas=(0.9, 0.99), eps=1e-3, period=4)


@pytest.mark.parametrize("cos", [0.9, 0.3, 0.0, -0.5])
def test_phi_is_one_minus_the_cosine_of_the_two_estimates(cos):
    # the part's vector split over two tensors, the second estimate 3 times longer (phi does
    # not depend on the estimates' scale): the sums are over both tensors
    model, optimizer = two_part_optimizer()
    agvm = AGVM(optimizer, start_iter=0)
    w = model["conv"].weight  # 54 elements; the bias takes 3 of a 57-long vector
    a, b = with_cosine(cos, d=w.numel() + 3, scale_b=3.0)
    estimates = [
        (w, a[:54].view_as(w).float(), b[:54].view_as(w).float()),
        (model["conv"].bias, a[54:].float(), b[54:].float()),
    ]
    stats = agvm.statistics(estimates)["backbone"]
    assert stats.dot == pytest.approx(cos * 3.0, abs=1e-5)
    assert stats.norm_a == pytest.approx(1.0, rel=1e-5)
    assert stats.norm_b == pytest.approx(9.0, rel=1e-5)
    assert gradient_variance(stats) == pytest.approx(1.0 - cos, abs=1e-6)


def test_phi_of_equal_opposite_and_zero_estimates():
    assert gradient_variance(PartStatistics(dot=4.0, norm_a=4.0, norm_b=4.0)) == 0.0
    assert gradient_variance(PartStatistics(dot=-4.0, norm_a=4.0, norm_b=4.0)) == 2.0
    # rounding above cos = 1 is clipped, a zero estimate has no direction
    assert gradient_variance(PartStatistics(dot=4.0 + 1e-12, norm_a=4.0, norm_b=4.0)) == 0.0
    assert math.isnan(gradient_variance(PartStatistics(dot=0.0, norm_a=0.0, norm_b=4.0)))


def test_phi_measures_the_noise_share_of_the_gradient():
    # g_A = g + n_A, g_B = g + n_B: 1 - cos ~ d sigma^2 / (|g|^2 + d sigma^2)
    g = torch.Generator().manual_seed(1)
    d, sigma = 200_000, 0.5
    signal = torch.ones(d, dtype=torch.float64)  # |g|^2 = d
    a = signal + sigma * torch.randn(d, generator=g, dtype=torch.float64)
    b = signal + sigma * torch.randn(d, generator=g, dtype=torch.float64)
    stats = PartStatistics(float(a @ b), float(a @ a), float(b @ b))
    assert gradient_variance(stats) == pytest.approx(sigma**2 / (1 + sigma**2), rel=0.01)


@pytest.mark.parametrize(
    "phi_ref, phi, expected",
    [
        (0.2, 0.1, math.sqrt(2.0)),  # inside the clamp
        (0.1, 0.4, math.sqrt(0.5)),  # ratio 0.25 clamped up to 0.5
        (0.9, 0.01, math.sqrt(10.0)),  # ratio 90 clamped down to 10
        (0.3, 0.0, math.sqrt(10.0)),  # identical estimates: ratio +inf
        (0.0, 0.3, math.sqrt(0.5)),
    ],
)
def test_mu_hat_is_the_square_root_of_the_clamped_ratio(phi_ref, phi, expected):
    assert modulation(phi_ref, phi, (0.5, 10.0)) == pytest.approx(expected, rel=1e-15)


def test_mu_hat_is_undefined_without_two_phis():
    assert math.isnan(modulation(0.0, 0.0, (0.5, 10.0)))
    assert math.isnan(modulation(math.nan, 0.2, (0.5, 10.0)))
    assert math.isnan(modulation(0.2, math.nan, (0.5, 10.0)))


def test_mu_is_a_moving_average_of_mu_hat_and_the_reference_stays_at_one():
    _, optimizer = two_part_optimizer()
    agvm = AGVM(optimizer, momentum=0.9, clamp=(0.5, 10.0))
    mu = 1.0
    for phi_ref, phi in [(0.4, 0.1), (0.4, 0.2), (0.1, 0.8), (0.3, 0.3)]:
        agvm.set_phi({"backbone": phi_ref, "head": phi})
        mu_hat = math.sqrt(min(max(phi_ref / phi, 0.5), 10.0))
        mu = 0.9 * mu + 0.1 * mu_hat
        assert agvm.mu == {"backbone": 1.0, "head": pytest.approx(mu, rel=1e-14)}
    # by hand: 1 -> 0.9 + 0.2 = 1.1 -> 0.99 + 0.1 sqrt(2) -> ... the loop's first value
    agvm2 = AGVM(two_part_optimizer()[1], momentum=0.9)
    agvm2.set_phi({"backbone": 0.4, "head": 0.1})
    assert agvm2.mu["head"] == pytest.approx(1.1)
    # an undefined mu_hat (the head's gradient was zero) leaves mu where it was
    agvm2.set_phi({"backbone": 0.4, "head": math.nan})
    assert agvm2.mu["head"] == pytest.approx(1.1) and agvm2.num_estimates == 2


def test_estimates_every_period_from_the_start_iteration():
    agvm = AGVM(two_part_optimizer()[1], period=3, start_iter=5)
    assert [i for i in range(15) if agvm.estimates_at(i)] == [5, 8, 11, 14]


@pytest.mark.parametrize("opt", ["adamw", "pmd_lamb"])
def test_adaptive_optimizers_compare_preconditioned_updates(opt):
    model, optimizer = two_part_optimizer(opt)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    g = torch.Generator().manual_seed(2)
    for _ in range(3):  # build up second moments
        for p in params:
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        optimizer.step()
    w = model["conv"].weight
    state = optimizer.state[w]
    beta2, eps = 0.99, 1e-3
    if opt == "adamw":
        v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
    else:  # PMD-LAMB keeps v_t / b_t with b_t the decayed weight sum
        v_hat = state["exp_avg_sq"]
        assert state["exp_avg_sq_weight"] != pytest.approx(1 - beta2**3)  # decay changed b_t
    g_a = torch.randn(w.shape, generator=g, dtype=torch.float64)
    expected = g_a / (v_hat.sqrt() + eps)
    torch.testing.assert_close(precondition(optimizer, optimizer.param_groups[0], w, g_a), expected)
    # phi on the preconditioned estimates, against a float64 reference
    g_b = g_a + torch.randn(w.shape, generator=g, dtype=torch.float64)
    agvm = AGVM(optimizer)
    stats = agvm.statistics([(w, g_a, g_b)])["backbone"]
    pa, pb = expected.flatten(), (g_b / (v_hat.sqrt() + eps)).flatten()
    cos = float(pa @ pb / (pa.norm() * pb.norm()))
    assert gradient_variance(stats) == pytest.approx(1 - cos, rel=1e-12)
    raw = PartStatistics(
        float(g_a.flatten() @ g_b.flatten()), float(g_a.norm() ** 2), float(g_b.norm() ** 2)
    )
    assert gradient_variance(raw) != pytest.approx(gradient_variance(stats), rel=1e-3)


def test_sgd_and_a_fresh_adaptive_state_compare_raw_gradients():
    model, sgd = two_part_optimizer("sgd")
    w = model["conv"].weight
    g = torch.randn(w.shape, dtype=torch.float64)
    assert precondition(sgd, sgd.param_groups[0], w, g) is g
    model, adamw = two_part_optimizer("adamw")
    assert precondition(adamw, adamw.param_groups[0], model["conv"].weight, g) is g


def test_modulated_lr_multiplies_each_part_and_restores_the_schedulers_lr():
    model, optimizer = two_part_optimizer()
    for g, lr in zip(optimizer.param_groups, (0.1, 0.05, 0.1)):
        g["lr"] = lr
    agvm = AGVM(optimizer)
    agvm.mu["head"] = 1.5
    seen = []
    step = optimizer.step
    optimizer.step = lambda: (seen.append([g["lr"] for g in optimizer.param_groups]), step())
    with agvm.modulated_lr():
        optimizer.step()
    assert seen == [[0.1, 0.05, 0.1 * 1.5]]
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.05, 0.1]
    with pytest.raises(RuntimeError), agvm.modulated_lr():  # restored on error too
        raise RuntimeError
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.05, 0.1]


class _Linear(nn.Module):
    """conv + head as in two_part_optimizer; the loss is linear in the weights, so its
    gradient is the batch itself, large enough to be clipped."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(2, 3, 3).double(), nn.Linear(3, 2).double()

    def forward(self, data):
        return {"loss": sum((p * data).sum() for p in self.parameters())}


@pytest.mark.parametrize("warmup_clip, expected", [(0.0, 1.0), (0.25, 0.25), (4.0, 1.0)])
def test_the_loop_clips_once_to_the_smaller_of_agvm_and_warmup_clip(warmup_clip, expected):
    """Inside AGVM's window (step 1) the step's gradient is clipped once, on the device, to
    the smaller of AGVM's norm and SOLVER.WARMUP_CLIP's; outside it (step 0) to
    WARMUP_CLIP's alone: the run plan's bound of each step."""
    from detectron2.config import get_cfg
    from detectron2.utils.events import EventStorage

    from largedet.config import add_largedet_config
    from largedet.engine.train_loop import AccumulationTrainer, StepPlan
    from largedet.solver import run_plan

    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list([
        "SOLVER.IMS_PER_BATCH", 4, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.WARMUP_ITERS", 1,
        "SOLVER.AGVM.ENABLED", True, "SOLVER.AGVM.CLIP_MAX_NORM", 1.0, "SOLVER.AGVM.CLIP_ITERS", (0, 1),
        "SOLVER.WARMUP_CLIP.MAX_NORM", warmup_clip, "SOLVER.WARMUP_CLIP.ITERS", (1, 1),
    ])  # fmt: skip
    plan = run_plan(cfg, 1)

    model = _Linear()
    groups = [
        {"params": [model.conv.weight], PART_KEY: "backbone"},
        {"params": [model.conv.bias], PART_KEY: "backbone"},
        {"params": list(model.head.parameters()), PART_KEY: "head"},
    ]
    optimizer = torch.optim.SGD(groups, lr=0.0)  # the weights stay: only the gradient counts
    agvm = AGVM(optimizer, period=1000, start_iter=1000)
    data = iter([torch.tensor(3.0, dtype=torch.float64)] * 8)
    trainer = AccumulationTrainer(model, data, optimizer, 2, agvm=agvm)
    norms = []
    with EventStorage(0) as storage:
        for it in range(2):
            storage.iter = it
            trainer.run_planned_step(it, StepPlan(plan.accumulation_at(it), plan.clip_at(it)))
            norms.append(math.sqrt(sum(float(p.grad.norm() ** 2) for p in model.parameters())))
    unclipped = 3.0 * math.sqrt(sum(p.numel() for p in model.parameters()))
    first = min(unclipped, warmup_clip) if warmup_clip else unclipped
    assert norms[0] == pytest.approx(first)
    assert norms[1] == pytest.approx(expected, rel=1e-5)


def test_state_dict_round_trip():
    agvm = AGVM(two_part_optimizer()[1], momentum=0.5)
    agvm.set_phi({"backbone": 0.3, "head": 0.1})
    other = AGVM(two_part_optimizer()[1], momentum=0.5)
    other.load_state_dict(agvm.state_dict())
    assert other.mu == agvm.mu and other.phi == agvm.phi and other.num_estimates == 1
    with pytest.raises(ValueError, match="rpn"):
        other.load_state_dict({"mu": {"rpn": 2.0}})


def test_every_group_must_name_its_part():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=PART_KEY):
        AGVM(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="reference part 'neck'"):
        AGVM(two_part_optimizer()[1], reference="neck")
    with pytest.raises(ValueError, match="clamp"):
        AGVM(two_part_optimizer()[1], clamp=(2.0, 10.0))
