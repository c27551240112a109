"""PMD-LAMB and LAMB against an independent float64 implementation of docs/pmd_lamb.md's equations."""

import copy
import io
import math

import pytest
import torch

from largedet.optim import LAMB, PMDLAMB
from largedet.optim import _base as optim_base

# ----------------------------------------------------------------------------------------
# Reference: docs/pmd_lamb.md "The update", written out literally in float64, with the raw
# moments m, v and their weights a, b (the optimizer stores m/a and v/b instead).
# ----------------------------------------------------------------------------------------


def ref_gamma(t, period, decay):
    u = ((t - 1) % period) / period
    if decay == "cosine":
        return (1.0 + math.cos(math.pi * u)) / 2.0
    if decay == "linear":
        return 1.0 - u
    assert decay == "none"
    return 1.0


class RefParam:
    def __init__(self, w):
        self.w = w.detach().to(torch.float64).clone()
        self.m = torch.zeros_like(self.w)
        self.v = torch.zeros_like(self.w)
        self.a = 0.0
        self.b = 0.0
        self.t = 0


def ref_step(p, g, *, lr, betas, eps, wd, period, decay, max_trust, adapt):
    """Returns the trust ratio before clamping (None when the guard set it to 1)."""
    beta1, beta2 = betas
    p.t += 1
    gamma = ref_gamma(p.t, period, decay)
    p.m = gamma * beta1 * p.m + (1 - beta1) * g
    p.v = gamma * beta2 * p.v + (1 - beta2) * g * g
    p.a = gamma * beta1 * p.a + (1 - beta1)
    p.b = gamma * beta2 * p.b + (1 - beta2)
    r = (p.m / p.a) / (torch.sqrt(p.v / p.b) + eps)
    x = r + wd * p.w
    raw = None
    trust = 1.0
    if adapt:
        w_norm = math.sqrt(float((p.w * p.w).sum()))
        x_norm = math.sqrt(float((x * x).sum()))
        if w_norm > 0 and x_norm > 0:
            raw = w_norm / x_norm
            trust = raw if max_trust is None else min(raw, max_trust)
    p.w = p.w - lr * trust * x
    return raw


def grad_fn(w, noise):
    """A gradient that depends on the weights (so errors would compound) plus noise."""
    return 0.5 * w + noise


# Three groups: defaults (weight decay, trust clamp at 10 active for the large tensor,
# a zero-initialised tensor); a non-adaptive group with its own period; an unclamped
# group with its own decay shape.
SHAPES = [(4, 5), (6,), (3, 3), (5,), (2, 3, 2)]
SCALES = [1.0, 30.0, 0.0, 1.0, 30.0]


def make_setup(decay, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    init = [
        s * torch.randn(shape, generator=gen, dtype=torch.float64)
        for shape, s in zip(SHAPES, SCALES)
    ]
    other = "linear" if decay != "linear" else "cosine"
    defaults = dict(
        lr=0.05,
        betas=(0.9, 0.99),
        eps=1e-6,
        weight_decay=0.01,
        period=7,
        decay=decay,
        max_trust_ratio=10.0,
        adapt=True,
    )
    group_over = [
        {},
        dict(adapt=False, weight_decay=0.0, period=5),
        dict(max_trust_ratio=None, decay=other, weight_decay=0.1),
    ]
    members = [[0, 1, 2], [3], [4]]
    return init, defaults, group_over, members


def run_reference(init, defaults, group_over, members, noises):
    refs = [RefParam(w) for w in init]
    clamped = False
    for noise in noises:
        for over, idx in zip(group_over, members):
            hp = {**defaults, **over}
            for i in idx:
                g = grad_fn(refs[i].w, noise[i])
                raw = ref_step(
                    refs[i],
                    g,
                    lr=hp["lr"],
                    betas=hp["betas"],
                    eps=hp["eps"],
                    wd=hp["weight_decay"],
                    period=hp["period"],
                    decay=hp["decay"],
                    max_trust=hp["max_trust_ratio"],
                    adapt=hp["adapt"],
                )
                clamped |= (
                    raw is not None
                    and hp["max_trust_ratio"] is not None
                    and raw > hp["max_trust_ratio"]
                )
        yield [r.w.clone() for r in refs], clamped


def build(init, defaults, group_over, members, foreach, dtype=torch.float64, cls=PMDLAMB):
    params = [torch.nn.Parameter(w.to(dtype).clone()) for w in init]
    groups = [
        {"params": [params[i] for i in idx], **over} for over, idx in zip(group_over, members)
    ]
    return params, cls(groups, **defaults, foreach=foreach)


def noises_for(n_steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
        for _ in range(n_steps)
    ]


def step_with_grads(params, opt, noise):
    for p, n in zip(params, noise):
        p.grad = grad_fn(p.detach(), n.to(p.dtype))
    opt.step()


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("decay", ["cosine", "linear", "none"])
def test_matches_float64_reference(decay, foreach):
    n_steps = 60  # 8+ periods of 7, 12 of 5
    init, defaults, group_over, members = make_setup(decay)
    noises = noises_for(n_steps)
    params, opt = build(init, defaults, group_over, members, foreach)
    clamped = False
    for noise, (expected, clamped) in zip(
        noises, run_reference(init, defaults, group_over, members, noises)
    ):
        step_with_grads(params, opt, noise)
        for p, e in zip(params, expected):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    assert clamped, "the max_trust_ratio clamp was never exercised"
    assert all(opt.state[p]["step"] == n_steps for p in params)
    # the weights really moved away from their start, the zero tensor included
    assert all((p.detach() - w).abs().max() > 0.1 for p, w in zip(params, init))


def test_stored_moments_are_normalised_averages():
    """exp_avg = m_t / a_t and the weights a_t, b_t follow docs/pmd_lamb.md's recursions."""
    init, defaults, group_over, members = make_setup("cosine")
    params, opt = build(init, defaults, [{}, {}, {}], members, foreach=True)
    ref = RefParam(init[0])
    noises = noises_for(10)
    for noise in noises:
        g = grad_fn(ref.w, noise[0])
        ref_step(
            ref,
            g,
            lr=0.05,
            betas=(0.9, 0.99),
            eps=1e-6,
            wd=0.01,
            period=7,
            decay="cosine",
            max_trust=10.0,
            adapt=True,
        )
        step_with_grads(params, opt, noise)
    state = opt.state[params[0]]
    assert state["step"] == 10
    assert state["exp_avg_weight"] == pytest.approx(ref.a, rel=1e-14)
    assert state["exp_avg_sq_weight"] == pytest.approx(ref.b, rel=1e-14)
    torch.testing.assert_close(state["exp_avg"], ref.m / ref.a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state["exp_avg_sq"], ref.v / ref.b, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------
# LAMB
# ----------------------------------------------------------------------------------------


def test_lamb_is_pmd_lamb_without_decay():
    init, defaults, group_over, members = make_setup("none")
    noises = noises_for(20)
    lamb_defaults = {k: v for k, v in defaults.items() if k not in ("period", "decay")}
    group_over = [{k: v for k, v in o.items() if k not in ("period", "decay")} for o in group_over]
    runs = []
    for make in (
        lambda: build(init, lamb_defaults, group_over, members, True, cls=LAMB),
        lambda: build(
            init, {**lamb_defaults, "decay": "none", "period": 7}, group_over, members, True
        ),
        # period 1: u = 0 at every step, so gamma = d(0) = 1 for any shape
        lambda: build(
            init, {**lamb_defaults, "decay": "cosine", "period": 1}, group_over, members, True
        ),
    ):
        params, opt = make()
        for noise in noises:
            step_with_grads(params, opt, noise)
        runs.append([p.detach().clone() for p in params])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_lamb_matches_bias_corrected_lamb():
    """LAMB of You et al. 2019, with m/(1 - beta1^t), v/(1 - beta2^t): no a_t, b_t, no gamma."""
    beta1, beta2, eps, lr, wd = 0.9, 0.999, 1e-6, 0.02, 0.05
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone())
    opt = LAMB([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd, max_trust_ratio=None)
    w, m, v = w0.clone(), torch.zeros_like(w0), torch.zeros_like(w0)
    for t in range(1, 31):
        g = torch.randn(7, 3, generator=gen, dtype=torch.float64)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        x = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps) + wd * w
        w = w - lr * (w.norm() / x.norm()) * x
        p.grad = g.clone()
        opt.step()
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
    assert opt.state[p]["exp_avg_weight"] == pytest.approx(1 - beta1**30, rel=1e-14)
    assert opt.state[p]["exp_avg_sq_weight"] == pytest.approx(1 - beta2**30, rel=1e-14)


# ----------------------------------------------------------------------------------------
# Trust ratio edge cases (both paths)
# ----------------------------------------------------------------------------------------


def one_step(w, g, foreach, **kw):
    p = torch.nn.Parameter(w.clone())
    opt = PMDLAMB([p], foreach=foreach, **kw)
    p.grad = g.clone()
    opt.step()
    return p.detach()


@pytest.mark.parametrize("foreach", [True, False])
def test_zero_weights_use_trust_one(foreach):
    g = torch.tensor([[0.3, -2.0], [1e-3, 5.0]], dtype=torch.float64)
    out = one_step(torch.zeros(2, 2, dtype=torch.float64), g, foreach, lr=0.1, weight_decay=0.5)
    # t = 1: m/a = g, v/b = g^2, so x = g / (|g| + eps); trust = 1 because ||w|| = 0
    torch.testing.assert_close(out, -0.1 * g / (g.abs() + 1e-6), rtol=1e-15, atol=0)


@pytest.mark.parametrize("foreach", [True, False])
def test_zero_update_leaves_weights_unchanged(foreach):
    w = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    out = one_step(w, torch.zeros(3, dtype=torch.float64), foreach, lr=0.1)
    assert torch.equal(out, w)
    out = one_step(
        torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), foreach, lr=0.1
    )
    assert torch.equal(out, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("max_trust_ratio", [2.0, None])
def test_trust_ratio_clamp(foreach, max_trust_ratio):
    w = torch.tensor([30.0, -40.0], dtype=torch.float64)  # ||w|| = 50
    g = torch.tensor([1.0, 1.0], dtype=torch.float64)
    out = one_step(w, g, foreach, lr=0.01, max_trust_ratio=max_trust_ratio)
    x = g / (g.abs() + 1e-6)
    raw = 50.0 / x.norm().item()  # about 35
    trust = raw if max_trust_ratio is None else 2.0
    torch.testing.assert_close(out, w - 0.01 * trust * x, rtol=1e-15, atol=0)


@pytest.mark.parametrize("foreach", [True, False])
def test_adapt_false_uses_trust_one(foreach):
    w = torch.tensor([30.0, -40.0], dtype=torch.float64)
    g = torch.tensor([1.0, -3.0], dtype=torch.float64)
    out = one_step(w, g, foreach, lr=0.01, weight_decay=0.1, adapt=False)
    torch.testing.assert_close(out, w - 0.01 * (g / (g.abs() + 1e-6) + 0.1 * w), rtol=1e-15, atol=0)


# ----------------------------------------------------------------------------------------
# Both code paths agree: mixed dtypes, non-contiguous tensors, low precision
# ----------------------------------------------------------------------------------------


def mixed_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(6, 4, generator=gen),  # float32
        torch.randn(5, 6, generator=gen, dtype=torch.float64).t(),  # float64, transposed
        torch.randn(10, 3, generator=gen)[::2],  # float32, strided rows
        torch.zeros(4, dtype=torch.float64),  # float64, zero weights
        torch.randn(3, 3, generator=gen).to(torch.bfloat16),  # low precision
        torch.randn(8, generator=gen, dtype=torch.float64),
    ]
    return [torch.nn.Parameter(t) for t in tensors]


def run_groups(params, adapted, plain, opt_cls, foreach, n_steps, seed, **kw):
    """``n_steps`` of ``opt_cls`` on two groups, ``adapted`` and ``plain`` (no trust ratio,
    no weight decay), with seeded random gradients; returns the parameters and optimizer."""
    groups = [{"params": adapted}, {"params": plain, "adapt": False, "weight_decay": 0.0}]
    opt = opt_cls(groups, foreach=foreach, **kw)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        opt.step()
    return params, opt


def run_mixed(opt_cls, foreach, n_steps, **kw):
    params = mixed_params()
    assert not params[1].is_contiguous() and not params[2].is_contiguous()
    adapted, plain = params[:3] + params[4:5], [params[3], params[5]]
    return run_groups(params, adapted, plain, opt_cls, foreach, n_steps, 5, **kw)


@pytest.mark.parametrize("bucket_numel", [None, 16])
def test_foreach_equals_per_tensor(bucket_numel, monkeypatch):
    if bucket_numel is not None:  # several foreach buckets per (device, dtype)
        monkeypatch.setattr(optim_base, "CPU_BUCKET_NUMEL", bucket_numel)
    kw = dict(lr=0.03, weight_decay=0.02, period=4, max_trust_ratio=1.5)
    fast, opt_fast = run_mixed(PMDLAMB, True, 13, **kw)
    slow, opt_slow = run_mixed(PMDLAMB, False, 13, **kw)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_fast.state[a][key], opt_slow.state[b][key])
    assert opt_fast.state[fast[4]]["exp_avg"].dtype == torch.float32  # bf16 parameter
    assert opt_fast.state[fast[1]]["exp_avg"].dtype == torch.float64


def contiguous_params(seed=0):
    """Contiguous parameters of several sizes, so that the CPU multi-tensor path cuts and
    groups them into pieces (sizes not multiples of the piece size: partial chunks)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(37, 29, generator=gen),  # 1073 elements: cut into pieces
        torch.randn(5, generator=gen),  # small: grouped with its neighbours
        torch.randn(7, 3, generator=gen),
        torch.randn(300, generator=gen, dtype=torch.float64),
        torch.randn(90, 2, generator=gen).to(torch.bfloat16),
        torch.zeros(13),  # zero weights: trust 1
    ]
    return [torch.nn.Parameter(t) for t in tensors]


def run_contiguous(foreach, n_steps, **kw):
    params = contiguous_params()
    return run_groups(params, params[:5], params[5:], PMDLAMB, foreach, n_steps, 3, **kw)


@pytest.mark.parametrize("weight_decay", [0.0, 0.02])
@pytest.mark.parametrize(("bucket_numel", "chunk_numel"), [(64, 48), (512, 100), (4096, 4096)])
def test_cpu_pieces_path_equals_per_tensor(weight_decay, bucket_numel, chunk_numel, monkeypatch):
    monkeypatch.setattr(optim_base, "CPU_BUCKET_NUMEL", bucket_numel)
    monkeypatch.setattr(optim_base, "CPU_CHUNK_NUMEL", chunk_numel)
    kw = dict(lr=0.03, weight_decay=weight_decay, period=4, max_trust_ratio=1.5)
    fast, opt_fast = run_contiguous(True, 9, **kw)
    slow, opt_slow = run_contiguous(False, 9, **kw)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_fast.state[a][key], opt_slow.state[b][key])
    # the pieces path ran: its scratch buffers exist, one per state dtype, and are
    # not part of the optimizer's state
    names = {(name, dtype) for name, _, dtype in opt_fast.scratch._buffers}
    assert names == {(n, d) for n in ("x", "denom") for d in (torch.float32, torch.float64)}
    assert "scratch" not in str(opt_fast.state_dict().keys())


def test_cpu_step_reuses_its_scratch_buffers(monkeypatch):
    monkeypatch.setattr(optim_base, "CPU_CHUNK_NUMEL", 100)
    params = contiguous_params()[:3]
    opt = PMDLAMB(params, lr=0.01, weight_decay=0.01)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    buffers = dict(opt.scratch._buffers)
    # x: the bucket (one, of 1073 + 5 + 21 elements); denom: one group of pieces
    assert buffers[("x", torch.device("cpu"), torch.float32)].numel() == 1099
    assert buffers[("denom", torch.device("cpu"), torch.float32)].numel() == 100
    opt.step()
    for key, buf in opt.scratch._buffers.items():
        assert buf.data_ptr() == buffers[key].data_ptr()
    copied = copy.deepcopy(opt)  # an optimizer with scratch buffers still copies
    assert torch.equal(copied.state[copied.param_groups[0]["params"][0]]["exp_avg"],
                       opt.state[params[0]]["exp_avg"])  # fmt: skip


def test_bf16_state_stays_float32_through_checkpoint():
    params, opt = run_mixed(PMDLAMB, True, 3, lr=0.01)
    saved = torch.load(io.BytesIO(save(opt)), weights_only=True)
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = PMDLAMB([{"params": params2[:3] + params2[4:5]}, {"params": [params2[3], params2[5]]}])
    opt2.load_state_dict(saved)
    state = opt2.state[params2[4]]
    assert state["exp_avg"].dtype == torch.float32
    assert torch.equal(state["exp_avg"], opt.state[params[4]]["exp_avg"])


# ----------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------


def save(opt):
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    return buf.getvalue()


@pytest.mark.parametrize("foreach", [True, False])
def test_state_dict_round_trip_mid_period(foreach):
    init, defaults, group_over, members = make_setup("cosine")
    noises = noises_for(25)
    k = 11  # period 7: step 11 is inside the second period (u = 3/7)

    params, opt = build(init, defaults, group_over, members, foreach)
    for noise in noises:
        step_with_grads(params, opt, noise)
    uninterrupted = [p.detach().clone() for p in params]

    params, opt = build(init, defaults, group_over, members, foreach)
    for noise in noises[:k]:
        step_with_grads(params, opt, noise)
    blob = save(opt)
    weights = [p.detach().clone() for p in params]
    del params, opt

    params, opt = build(weights, defaults, group_over, members, foreach)
    opt.load_state_dict(torch.load(io.BytesIO(blob), weights_only=True))
    assert opt.state[params[0]]["step"] == k
    for noise in noises[k:]:
        step_with_grads(params, opt, noise)
    for p, e in zip(params, uninterrupted):
        assert torch.equal(p.detach(), e)


def test_checkpoint_without_newer_hyperparameters_loads():
    init, defaults, group_over, members = make_setup("linear")
    group_over = [{}, {}, {}]
    noises = noises_for(12)
    params, opt = build(init, defaults, group_over, members, True)
    for noise in noises:
        step_with_grads(params, opt, noise)
    uninterrupted = [p.detach().clone() for p in params]

    params, opt = build(init, defaults, group_over, members, True)
    for noise in noises[:5]:
        step_with_grads(params, opt, noise)
    old = copy.deepcopy(opt.state_dict())
    for group in old["param_groups"]:
        for key in ("period", "decay", "max_trust_ratio", "adapt", "foreach"):
            del group[key]
    weights = [p.detach().clone() for p in params]

    params, opt = build(weights, defaults, group_over, members, True)
    opt.load_state_dict(old)
    for group in opt.param_groups:
        assert (group["period"], group["decay"], group["max_trust_ratio"], group["adapt"]) == (
            7,
            "linear",
            10.0,
            True,
        )
    for noise in noises[5:]:
        step_with_grads(params, opt, noise)
    for p, e in zip(params, uninterrupted):
        assert torch.equal(p.detach(), e)


def test_setstate_fills_class_defaults():
    p = torch.nn.Parameter(torch.ones(2))
    for cls, decay in ((PMDLAMB, "cosine"), (LAMB, "none")):
        opt = cls([p])
        state = dict(opt.__dict__)
        state["defaults"] = {k: v for k, v in opt.defaults.items() if k not in ("decay", "period")}
        state["param_groups"] = [
            {k: v for k, v in g.items() if k not in ("decay", "period")} for g in opt.param_groups
        ]
        fresh = cls.__new__(cls)
        fresh.__setstate__(state)
        assert fresh.param_groups[0]["decay"] == decay and fresh.defaults["decay"] == decay


# ----------------------------------------------------------------------------------------
# API
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(betas=(1.0, 0.999)), "betas"),
        (dict(betas=(0.9, -0.1)), "betas"),
        (dict(eps=0.0), "eps"),
        (dict(weight_decay=-1.0), "weight_decay"),
        (dict(period=0), "period"),
        (dict(period=2.5), "period"),
        (dict(decay="exponential"), "decay"),
        (dict(max_trust_ratio=0.0), "max_trust_ratio"),
    ],
)
def test_invalid_hyperparameters(kwargs, name):
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=name):
        PMDLAMB([p], **kwargs)
    with pytest.raises(ValueError, match=name):  # per group, too
        PMDLAMB([{"params": [torch.nn.Parameter(torch.ones(2))], **kwargs}])


def test_skipped_parameter_keeps_its_phase_and_closure_loss():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = PMDLAMB([a, b], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (a**2).sum()  # b gets no gradient
        loss.backward()
        return loss

    for _ in range(3):
        before = a.detach().clone()
        loss = opt.step(closure)
        assert loss.item() == (before**2).sum().item()
        assert not torch.equal(a.detach(), before)
    assert opt.state[a]["step"] == 3 and b not in opt.state
    assert torch.equal(b.detach(), torch.ones(2))


@pytest.mark.parametrize("decay", ["cosine", "linear", "none"])
def test_converges_on_least_squares(decay):
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(32, 16, generator=gen)
    w_true = torch.randn(16, 1, generator=gen)
    y = A @ w_true
    w = torch.nn.Parameter(torch.randn(16, 1, generator=gen))
    opt = PMDLAMB([w], lr=0.05, period=20, decay=decay)
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


def test_generator_params_and_complex_rejected():
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    opt = PMDLAMB([{"params": (p for p in params)}], lr=0.1)
    assert opt.param_groups[0]["params"] == params
    with pytest.raises(ValueError, match="complex"):
        PMDLAMB([torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))])


@pytest.mark.parametrize(
    ("sizes", "limit", "expected"),
    [
        # small tensors grouped up to the limit
        ([3, 4, 2], 8, [[(0, 3), (1, 4)], [(2, 2)]]),
        # a large tensor cut into limit-sized chunks and a remainder; the remainder
        # starts a group that the next small tensor joins
        ([20, 2], 8, [[(0, 8)], [(0, 8)], [(0, 4), (1, 2)]]),
        ([8, 8], 8, [[(0, 8)], [(1, 8)]]),
    ],
)
def test_cpu_pieces_groups(sizes, limit, expected):
    tensors = [torch.arange(n, dtype=torch.float32) + 100 * i for i, n in enumerate(sizes)]
    doubled = [t * 2 for t in tensors]
    groups = optim_base.cpu_pieces([tensors, doubled], limit)
    assert [[(i, p.numel()) for i, p in zip(idx, pieces[0])] for idx, pieces in groups] == expected
    # every element exactly once, in order, the two lists piece by piece in step, and
    # the pieces are views: writing through them writes the tensors
    flat = torch.cat([p for _, (pieces, _) in groups for p in pieces])
    assert torch.equal(flat, torch.cat(tensors))
    for _, (pieces, twice) in groups:
        for p, q in zip(pieces, twice):
            assert torch.equal(q, p * 2)
            p.zero_()
    assert all(int(t.count_nonzero()) == 0 for t in tensors)


def test_zero_size_tensors_and_bucket_boundaries_between_groups():
    empty, small = torch.zeros(0), torch.ones(3)
    meta = torch.zeros(3, device="meta")
    # a (device, dtype) group always starts a bucket of its own, a zero-size tensor too
    assert optim_base.foreach_buckets([empty, small]) == [(torch.float32, [0, 1])]
    assert optim_base.foreach_buckets([meta, empty]) == [(torch.float32, [0]), (torch.float32, [1])]
    # and the optimizers step over a zero-size parameter
    params = [torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.ones(3))]
    for p in params:
        p.grad = torch.ones_like(p)
    PMDLAMB(params, lr=0.1).step()
    assert params[0].numel() == 0 and torch.all(params[1] < 1.0)
