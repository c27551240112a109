"""LARS against its formula (You et al. 2017, Algorithm 1), written out in float64."""

import io
import math

import pytest
import torch

from largedet.optim import LARS
from largedet.optim import _base as optim_base


def ref_lars_step(w, buf, g, *, lr, momentum, wd, eta, adapt):
    d = g + wd * w
    trust = 1.0
    if adapt:
        w_norm = math.sqrt(float((w * w).sum()))
        g_norm = math.sqrt(float((g * g).sum()))
        if w_norm > 0 and g_norm > 0:
            trust = eta * w_norm / (g_norm + wd * w_norm)
    buf = momentum * buf + lr * trust * d
    return w - buf, buf


SHAPES = [(4, 5), (6,), (3, 3), (5,), (2, 3, 2)]
# group 0: defaults (adaptive, weight decay; one zero-initialised tensor); group 1: not
# adaptive, its own momentum; group 2: its own eta and weight decay.
GROUPS = [
    ([0, 1, 2], {}),
    ([3], dict(adapt=False, momentum=0.5, weight_decay=0.0)),
    ([4], dict(eta=0.01, weight_decay=0.1)),
]
DEFAULTS = dict(lr=0.5, momentum=0.9, weight_decay=0.01, eta=0.002, adapt=True)


def lr_at(t):
    return 0.5 * min(1.0, t / 10)  # a warm-up: the LR sits inside the momentum buffer


def initial_weights():
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(s, generator=gen, dtype=torch.float64) * (0.0 if i == 2 else 1.0)
        for i, s in enumerate(SHAPES)
    ]


def noises_for(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES] for _ in range(n)]


def build(weights, foreach):
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    groups = [{"params": [params[i] for i in idx], **over} for idx, over in GROUPS]
    return params, LARS(groups, **DEFAULTS, foreach=foreach)


def step(params, opt, noise, t):
    for group in opt.param_groups:
        group["lr"] = lr_at(t)
    for p, n in zip(params, noise):
        p.grad = 0.5 * p.detach() + n
    opt.step()


@pytest.mark.parametrize("foreach", [True, False])
def test_matches_formula(foreach):
    n_steps = 40
    init = initial_weights()
    noises = noises_for(n_steps)
    params, opt = build(init, foreach)
    ref_w = [w.clone() for w in init]
    ref_buf = [torch.zeros_like(w) for w in init]
    for t, noise in enumerate(noises, start=1):
        step(params, opt, noise, t)
        for idx, over in GROUPS:
            hp = {**DEFAULTS, **over}
            for i in idx:
                g = 0.5 * ref_w[i] + noise[i]
                ref_w[i], ref_buf[i] = ref_lars_step(
                    ref_w[i],
                    ref_buf[i],
                    g,
                    lr=lr_at(t),
                    momentum=hp["momentum"],
                    wd=hp["weight_decay"],
                    eta=hp["eta"],
                    adapt=hp["adapt"],
                )
        for p, e in zip(params, ref_w):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    assert all((p.detach() - w).abs().max() > 1e-2 for p, w in zip(params, init))
    assert opt.state[params[0]]["step"] == n_steps


@pytest.mark.parametrize("foreach", [True, False])
def test_zero_norm_guards(foreach):
    g = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, -2.0], dtype=torch.float64)
    cases = [
        (torch.zeros(3, dtype=torch.float64), g, 0.3, -0.1 * g),  # ||w|| = 0: trust 1
        (w, torch.zeros(3, dtype=torch.float64), 0.0, w),  # ||g|| = 0, no decay: unchanged
        (w, torch.zeros(3, dtype=torch.float64), 0.3, w - 0.1 * 0.3 * w),  # ||g|| = 0: trust 1
    ]
    for w0, g0, wd, expected in cases:
        p = torch.nn.Parameter(w0.clone())
        opt = LARS([p], lr=0.1, weight_decay=wd, eta=0.001, foreach=foreach)
        p.grad = g0.clone()
        opt.step()
        torch.testing.assert_close(p.detach(), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("bucket_numel", [None, 16])
def test_foreach_equals_per_tensor_mixed_dtypes(bucket_numel, monkeypatch):
    if bucket_numel is not None:  # several foreach buckets per (device, dtype)
        monkeypatch.setattr(optim_base, "CPU_BUCKET_NUMEL", bucket_numel)

    def run(foreach):
        gen = torch.Generator().manual_seed(0)
        params = [
            torch.nn.Parameter(torch.randn(6, 4, generator=gen)),
            torch.nn.Parameter(torch.randn(5, 6, generator=gen, dtype=torch.float64).t()),
            torch.nn.Parameter(torch.randn(10, 3, generator=gen)[::2]),
            torch.nn.Parameter(torch.randn(3, 3, generator=gen).to(torch.bfloat16)),
            torch.nn.Parameter(torch.zeros(4, dtype=torch.float64)),
        ]
        assert not params[1].is_contiguous() and not params[2].is_contiguous()
        opt = LARS(
            [{"params": params[:4]}, {"params": params[4:], "adapt": False}],
            lr=0.2,
            weight_decay=0.01,
            foreach=foreach,
        )
        for _ in range(9):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            opt.step()
        return params, opt

    (fast, opt_fast), (slow, opt_slow) = run(True), run(False)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
        assert torch.equal(
            opt_fast.state[a]["momentum_buffer"], opt_slow.state[b]["momentum_buffer"]
        )
    assert opt_fast.state[fast[3]]["momentum_buffer"].dtype == torch.float32


@pytest.mark.parametrize("foreach", [True, False])
def test_state_dict_round_trip(foreach):
    noises = noises_for(20)
    params, opt = build(initial_weights(), foreach)
    for t, noise in enumerate(noises, start=1):
        step(params, opt, noise, t)
    expected = [p.detach().clone() for p in params]

    params, opt = build(initial_weights(), foreach)
    for t, noise in enumerate(noises[:8], start=1):
        step(params, opt, noise, t)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    params, opt = build([p.detach() for p in params], foreach)
    opt.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    for t, noise in enumerate(noises[8:], start=9):
        step(params, opt, noise, t)
    for p, e in zip(params, expected):
        assert torch.equal(p.detach(), e)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(lr=-0.1), "lr"),
        (dict(momentum=-0.9), "momentum"),
        (dict(weight_decay=-1e-4), "weight_decay"),
        (dict(eta=0.0), "eta"),
    ],
)
def test_invalid_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LARS([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_converges_on_least_squares():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(32, 16, generator=gen)
    y = A @ torch.randn(16, 1, generator=gen)
    w = torch.nn.Parameter(torch.randn(16, 1, generator=gen))
    opt = LARS([w], lr=1.0, momentum=0.9, eta=0.02)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=300)

    def loss_fn():
        return ((A @ w - y) ** 2).mean()

    first = loss_fn().item()
    for _ in range(300):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
        sched.step()
    assert loss_fn().item() < 1e-4 * first
