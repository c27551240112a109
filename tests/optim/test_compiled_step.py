"""The compiled step (``fused=True``, largedet.optim._compiled) of PMD-LAMB, LAMB and LARS:
against the float64 references of test_pmd_lamb.py and test_lars.py, against the eager
step over many float32 steps, with checkpoints moving between the two, without
recompiling as the LR and the decay factor change, and falling back to the eager step
when compilation fails."""

import io

import pytest
import test_lars
from engine_testing import largedet_log
import torch
from test_pmd_lamb import make_setup, noises_for, run_reference, step_with_grads

from largedet.optim import LAMB, LARS, PMDLAMB, _compiled
from largedet.optim import _base as optim_base


def graphs_compiled():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def build_fused(init, defaults, group_over, members, cls=PMDLAMB, **kw):
    params = [torch.nn.Parameter(w.clone()) for w in init]
    groups = [{"params": [params[i] for i in idx], **o} for o, idx in zip(group_over, members)]
    return params, cls(groups, **defaults, **kw)


@pytest.mark.parametrize("decay", ["cosine", "linear", "none"])
def test_pmd_lamb_compiled_matches_float64_reference(decay):
    n_steps = 40  # 5+ periods of 7, 8 of 5
    init, defaults, group_over, members = make_setup(decay)
    noises = noises_for(n_steps)
    params, opt = build_fused(init, defaults, group_over, members, fused=True)
    clamped = False
    for k, (noise, (expected, clamped)) in enumerate(
        zip(noises, run_reference(init, defaults, group_over, members, noises))
    ):
        step_with_grads(params, opt, noise)
        if k == 1:
            graphs = graphs_compiled()
        for p, e in zip(params, expected):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    assert clamped, "the max_trust_ratio clamp was never exercised"
    assert all(opt.state[p]["step"] == n_steps for p in params)
    # gamma, and with it the moment weights, changed at every step: nothing recompiled
    assert graphs_compiled() == graphs
    assert opt.compiled_state.disabled_reason is None


def test_lars_compiled_matches_formula():
    n_steps = 30
    init = test_lars.initial_weights()
    noises = test_lars.noises_for(n_steps)
    params = [torch.nn.Parameter(w.clone()) for w in init]
    groups = [{"params": [params[i] for i in idx], **over} for idx, over in test_lars.GROUPS]
    opt = LARS(groups, **test_lars.DEFAULTS, fused=True)
    ref_w = [w.clone() for w in init]
    ref_buf = [torch.zeros_like(w) for w in init]
    for t, noise in enumerate(noises, start=1):
        test_lars.step(params, opt, noise, t)  # the LR changes at every step of the warm-up
        if t == 2:
            graphs = graphs_compiled()
        for idx, over in test_lars.GROUPS:
            hp = {**test_lars.DEFAULTS, **over}
            for i in idx:
                g = 0.5 * ref_w[i] + noise[i]
                ref_w[i], ref_buf[i] = test_lars.ref_lars_step(
                    ref_w[i], ref_buf[i], g, lr=test_lars.lr_at(t), momentum=hp["momentum"],
                    wd=hp["weight_decay"], eta=hp["eta"], adapt=hp["adapt"],
                )  # fmt: skip
        for p, e in zip(params, ref_w):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    assert graphs_compiled() == graphs
    assert all((p.detach() - w).abs().max() > 1e-2 for p, w in zip(params, init))


def float32_params(seed=0):
    """float32 parameters of several shapes (a channels-last 4-D one, sizes with odd and
    power-of-two factors, a 1-element one), a bf16 one and a strided one, which the
    compiled step leaves to the eager step."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(16, 8, 3, 3, generator=gen).to(memory_format=torch.channels_last),
        torch.randn(37, 29, generator=gen),
        torch.randn(2048, generator=gen),
        torch.randn(1, generator=gen),
        torch.randn(24, 5, generator=gen).to(torch.bfloat16),
        torch.randn(10, 6, generator=gen)[::2],
        torch.zeros(13),
    ]
    return [torch.nn.Parameter(t) for t in tensors]


def run_float32(cls, n_steps, fused, opt=None, params=None, seed=7, start=0, **kw):
    """``n_steps`` of ``cls`` on two groups of ``float32_params`` with seeded gradients; the
    LR and (PMD-LAMB) the clock change at every step; a run resumed at ``start`` sees the
    gradients an uninterrupted one sees."""
    if params is None:
        params = float32_params()
    if opt is None:
        groups = [{"params": params[:6]}, {"params": params[6:], "adapt": False}]
        opt = cls(groups, fused=fused, **kw)
    for t in range(start, start + n_steps):
        gen = torch.Generator().manual_seed(seed * 1000 + t)  # step t's gradients, however run
        for group in opt.param_groups:
            group["lr"] = 0.02 * (1 + t % 5) / 5
        if isinstance(opt, PMDLAMB):
            opt.set_clock(0.75 * t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype) + 0.1 * p.detach()
        opt.step()
    return params, opt


STATE = {PMDLAMB: ("exp_avg", "exp_avg_sq"), LAMB: ("exp_avg", "exp_avg_sq"),
         LARS: ("momentum_buffer",)}  # fmt: skip
KW = {PMDLAMB: dict(weight_decay=0.01, period=6), LAMB: dict(weight_decay=0.01),
      LARS: dict(weight_decay=1e-3, eta=0.02)}  # fmt: skip


@pytest.mark.parametrize("cls", [PMDLAMB, LAMB, LARS])
def test_compiled_equals_eager_over_many_float32_steps(cls):
    n_steps = 60
    fused, opt_fused = run_float32(cls, n_steps, True, **KW[cls])
    graphs = graphs_compiled()
    eager, opt_eager = run_float32(cls, n_steps, False, **KW[cls])
    for i, (a, b) in enumerate(zip(fused, eager)):
        assert a.dtype == b.dtype and a.stride() == b.stride()
        if a.dtype == torch.bfloat16:  # float32 rounding differences can flip a bf16 rounding
            torch.testing.assert_close(a, b, rtol=0, atol=2 ** -7 * float(b.abs().max()))
        else:
            torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
        for key in STATE[cls]:
            sa, sb = opt_fused.state[a][key], opt_eager.state[b][key]
            assert sa.dtype == sb.dtype == torch.float32 and sa.stride() == sb.stride()
            torch.testing.assert_close(sa, sb, rtol=2e-5, atol=1e-6)
    # the weights moved: the comparison is not between two unchanged copies
    assert (fused[0].detach() - float32_params()[0]).abs().max() > 0.05
    run_float32(cls, 5, True, opt=opt_fused, params=fused, start=n_steps)
    assert graphs_compiled() == graphs  # 5 more steps, other LRs: nothing recompiled


def state_layout(opt):
    state = opt.state_dict()["state"]
    return {pid: {k: (type(v), getattr(v, "shape", None), getattr(v, "dtype", None))
                  for k, v in s.items()} for pid, s in state.items()}  # fmt: skip


@pytest.mark.parametrize("cls", [PMDLAMB, LARS])
def test_checkpoints_move_between_compiled_and_eager(cls):
    n_steps, k = 30, 12
    reference, _ = run_float32(cls, n_steps, False, **KW[cls])
    for first, second in ((True, False), (False, True)):
        params, opt = run_float32(cls, k, first, **KW[cls])
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        groups = [{"params": params[:6]}, {"params": params[6:], "adapt": False}]
        resumed = cls(groups, fused=second, **KW[cls])
        resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        assert state_layout(resumed) == state_layout(opt)  # the same keys, types, shapes
        assert all(g["fused"] is second for g in resumed.param_groups)
        run_float32(cls, n_steps - k, None, opt=resumed, params=params, start=k)
        for a, b in zip(params, reference):
            tol = dict(rtol=0, atol=2 ** -7 * float(b.abs().max())) if a.dtype == torch.bfloat16 \
                else dict(rtol=2e-5, atol=1e-6)  # fmt: skip
            torch.testing.assert_close(a.detach(), b.detach(), **tol)


def test_failed_compilation_falls_back_with_one_line(monkeypatch, caplog):
    def broken(name):
        def fail(*args):
            raise RuntimeError("no C++ compiler\nsecond line")

        return fail

    monkeypatch.setattr(_compiled, "_compiled", broken)
    with largedet_log(caplog):
        fused, opt_fused = run_float32(PMDLAMB, 4, True, **KW[PMDLAMB])
    eager, opt_eager = run_float32(PMDLAMB, 4, False, **KW[PMDLAMB])
    for a, b in zip(fused, eager):
        assert torch.equal(a, b)  # the eager multi-tensor step, exactly
    lines = [r.getMessage() for r in caplog.records if r.name == "largedet.optim._compiled"]
    assert lines == [
        "Compiled optimizer step unavailable (RuntimeError: no C++ compiler): "
        "taking the eager multi-tensor step"
    ]
    assert opt_fused.compiled_state.disabled_reason == "RuntimeError: no C++ compiler"
    # the fallback is that optimizer's: another one of the process compiles its own step
    assert opt_eager.compiled_state.disabled_reason is None
    monkeypatch.undo()
    _, other = run_float32(PMDLAMB, 1, True, **KW[PMDLAMB])
    assert other.compiled_state.disabled_reason is None


def test_as_matrix_shares_memory_and_is_not_a_view():
    t = torch.arange(24.0).view(2, 3, 4)
    m = _compiled.as_matrix(t)
    assert m.shape == (3, 8) and m._base is None
    m[0, 0] = -1.0
    assert t[0, 0, 0] == -1.0
    assert _compiled.as_matrix(torch.zeros(4096)).shape == (4, 1024)
    assert _compiled.as_matrix(torch.zeros(7)).shape == (7, 1)
    cl = torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert _compiled.flattenable([cl, torch.zeros_like(cl)])
    assert not _compiled.flattenable([cl, torch.zeros(2, 3, 4, 5)])  # strides differ
    assert not _compiled.flattenable([torch.zeros(6, 4)[::2]])


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(fused=1), "fused"), (dict(foreach="yes"), "foreach")],
)  # fmt: skip
@pytest.mark.parametrize("cls", [PMDLAMB, LAMB, LARS])
def test_invalid_switches(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls([torch.nn.Parameter(torch.ones(2))], **kwargs)



def test_default_compiles_the_large_cpu_tensors_only(monkeypatch):
    """fused=None: tensors of COMPILED_MIN_NUMEL elements or more take the compiled step,
    smaller ones the eager multi-tensor step; foreach=False keeps the per-tensor path."""
    compiled_sizes = []
    run = _compiled.run_compiled

    def spy(name, tensors, scalars, state):
        compiled_sizes.extend(column[0].numel() for column in tensors)
        return run(name, tensors, scalars, state)

    monkeypatch.setattr(_compiled, "run_compiled", spy)
    least = optim_base.COMPILED_MIN_NUMEL
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(least, generator=gen), torch.randn(least - 1, generator=gen),
            torch.randn(5, 7, generator=gen)]  # fmt: skip
    grads = [torch.randn(t.shape, generator=gen) for t in init]
    results = {}
    for name, kw in (("default", {}), ("eager", dict(fused=False)),
                     ("reference path", dict(foreach=False))):  # fmt: skip
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = PMDLAMB(params, lr=0.01, weight_decay=0.01, **kw)
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
        results[name] = params
        if name == "default":
            assert compiled_sizes == [least] * 3  # the large tensor, at each of 3 steps
        else:
            assert compiled_sizes == [least] * 3  # nothing more was compiled
    for a, b in zip(results["default"], results["eager"]):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
    for a, b in zip(results["eager"], results["reference path"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode, fused", [("auto", None), ("always", True), ("never", False)])
def test_solver_compiled_step_key(mode, fused, caplog):
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet.solver import build_optimizer

    cfg = add_largedet_config(get_cfg())
    cfg.SOLVER.OPTIMIZER = "PMD_LAMB"
    cfg.SOLVER.COMPILED_STEP = mode
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 2))
    with largedet_log(caplog):
        opt = build_optimizer(cfg, model)
    assert all(g["fused"] is fused for g in opt.param_groups)
    # the 256 x 256 weight (65,536 elements) is the one large tensor
    compiled = {"auto": 1, "always": 2, "never": 0}[mode]
    lines = [r.getMessage() for r in caplog.records if "param group 0" in r.getMessage()]
    assert lines and lines[0].endswith(f"compiled step for {compiled} of them")


def test_large_tensors_take_the_two_graph_path(monkeypatch):
    """Above SINGLE_GRAPH_MAX_NUMEL the moments and the update are two graphs; the numbers
    are those of the one-graph path."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(64, 48, generator=gen), torch.randn(300, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in init] for _ in range(4)]
    runs, used = [], []
    get = _compiled._compiled
    monkeypatch.setattr(_compiled, "_compiled", lambda name: used.append(name) or get(name))
    for limit in (1 << 22, 1000):  # the 64 x 48 tensor is above 1000
        monkeypatch.setattr(_compiled, "SINGLE_GRAPH_MAX_NUMEL", limit)
        used.clear()
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = PMDLAMB(params, lr=0.01, weight_decay=0.01, fused=True)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt.step()
        runs.append(params)
        per_step = ["pmd_lamb", "pmd_lamb"] if limit > 1000 else \
            ["pmd_lamb_moments", "pmd_lamb_apply", "pmd_lamb"]  # fmt: skip
        assert used == per_step * len(grads)
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
