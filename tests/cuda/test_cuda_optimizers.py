"""PMD-LAMB, LAMB and LARS on CUDA with mixed fp32 / bf16 parameters: the multi-tensor
(foreach) path, the per-tensor path and a float64 reference of the equations (written out
here from docs/pmd_lamb.md and the LARS paper, independently of the tested code) agree."""

import math

import pytest
import torch

from largedet.optim import LAMB, LARS, PMDLAMB

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STEPS = 12

# (shape, dtype, scale of the initial values, transposed): several CUDA blocks (300x257),
# a non-contiguous tensor, a zero tensor (the zero-norm guard), a large-norm tensor (the
# trust-ratio clamp of PMD-LAMB / LAMB), bf16 tensors in both groups.
PARAMS = [
    ((64, 33), torch.float32, 1.0, False),
    ((40, 30), torch.float32, 1.0, True),
    ((300, 257), torch.bfloat16, 1.0, False),
    ((5, 5), torch.float32, 0.0, False),
    ((9,), torch.float32, 30.0, False),
    ((17,), torch.bfloat16, 1.0, False),
    ((33,), torch.float32, 1.0, False),
]
ADAPTIVE, PLAIN = [0, 1, 2, 3, 4], [5, 6]  # group 0: defaults; group 1: no trust ratio

# Tolerances on the weights after STEPS steps (|actual - expected| <= atol + rtol * |expected|).
# fp32: the optimizer computes in fp32 what the reference computes in float64 (and norms are
# reduced in another order by the foreach and per-tensor kernels): about 1e-7 relative per
# step, 1e-6 after 12; 1e-5 leaves 10x room, while a wrong moment, decay or trust ratio moves
# the weights by a good part of the 12 * lr they travel.
FP32 = dict(rtol=1e-5, atol=1e-6)
# bf16: both sides round the weights to bf16 after every step (the reference explicitly), but
# fp32 arithmetic can put a value on the other side of a rounding boundary than float64 does:
# one unit in the last place (2^-8 to 2^-7 relative), rarely twice; two units are allowed.
BF16 = dict(rtol=2.0**-6, atol=1e-6)

PMD = dict(
    lr=0.02, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01, period=4, decay="cosine",
    max_trust_ratio=10.0,
)  # fmt: skip
LAMB_HP = {k: v for k, v in PMD.items() if k not in ("period", "decay")}
LARS_HP = dict(lr=0.5, momentum=0.9, weight_decay=0.01, eta=0.002)
PLAIN_GROUP = {
    "PMDLAMB": dict(adapt=False, weight_decay=0.0),
    "LARS": dict(adapt=False, momentum=0.5),
}


def initial_weights():
    gen = torch.Generator().manual_seed(0)
    weights = []
    for shape, dtype, scale, transposed in PARAMS:
        w = torch.randn(shape[::-1] if transposed else shape, generator=gen, dtype=torch.float64)
        w = (w * scale).to(dtype)
        weights.append(w.t() if transposed else w)
    return weights


def gradients():
    gen = torch.Generator().manual_seed(1)
    return [
        [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s, dtype, _, _ in PARAMS]
        for _ in range(STEPS)
    ]


# --- the float64 reference ------------------------------------------------------------


class Ref:
    """One parameter in float64 on the CPU, rounded to its dtype after every step."""

    def __init__(self, w, dtype):
        self.w, self.dtype = w.to(torch.float64).clone(), dtype
        self.m, self.v = torch.zeros_like(self.w), torch.zeros_like(self.w)
        self.buf = torch.zeros_like(self.w)
        self.a = self.b = 0.0
        self.t = 0

    def store(self, w):
        self.w = w.to(self.dtype).to(torch.float64)


def ref_pmd_lamb(p, g, *, lr, betas, eps, weight_decay, period, decay, max_trust_ratio, adapt):
    """docs/pmd_lamb.md, "The update"."""
    beta1, beta2 = betas
    p.t += 1
    u = ((p.t - 1) % period) / period
    gamma = {"cosine": (1 + math.cos(math.pi * u)) / 2, "linear": 1 - u, "none": 1.0}[decay]
    p.m = gamma * beta1 * p.m + (1 - beta1) * g
    p.v = gamma * beta2 * p.v + (1 - beta2) * g * g
    p.a = gamma * beta1 * p.a + (1 - beta1)
    p.b = gamma * beta2 * p.b + (1 - beta2)
    x = (p.m / p.a) / ((p.v / p.b).sqrt() + eps) + weight_decay * p.w
    trust = 1.0
    w_norm, x_norm = p.w.norm().item(), x.norm().item()
    if adapt and w_norm > 0 and x_norm > 0:
        trust = min(w_norm / x_norm, max_trust_ratio)
    p.store(p.w - lr * trust * x)


def ref_lars(p, g, *, lr, momentum, weight_decay, eta, adapt):
    """You et al. 2017, Algorithm 1 (the learning rate inside the momentum buffer)."""
    d = g + weight_decay * p.w
    trust = 1.0
    w_norm, g_norm = p.w.norm().item(), g.norm().item()
    if adapt and w_norm > 0 and g_norm > 0:
        trust = eta * w_norm / (g_norm + weight_decay * w_norm)
    p.buf = momentum * p.buf + lr * trust * d
    p.store(p.w - p.buf)


CASES = {
    "PMD-LAMB": (PMDLAMB, PMD, ref_pmd_lamb, PLAIN_GROUP["PMDLAMB"]),
    "LAMB": (LAMB, LAMB_HP, ref_pmd_lamb, PLAIN_GROUP["PMDLAMB"]),
    "LARS": (LARS, LARS_HP, ref_lars, PLAIN_GROUP["LARS"]),
}


def reference(case):
    _, hp, step, plain = CASES[case]
    if case == "LAMB":
        hp = {**hp, "period": 1, "decay": "none"}  # LAMB: PMD-LAMB without the decay
    refs = [Ref(w, dtype) for w, (_, dtype, _, _) in zip(initial_weights(), PARAMS)]
    for grads in gradients():
        for indices, over in ((ADAPTIVE, {"adapt": True}), (PLAIN, {"adapt": True, **plain})):
            for i in indices:
                step(refs[i], grads[i].to(torch.float64), **{**hp, **over})
    return [r.w for r in refs]


def run_on_cuda(case, foreach, fused=False):
    cls, hp, _, plain = CASES[case]
    params = [torch.nn.Parameter(w.cuda()) for w in initial_weights()]
    assert not params[1].is_contiguous()
    groups = [
        {"params": [params[i] for i in ADAPTIVE]},
        {"params": [params[i] for i in PLAIN], **plain},
    ]
    opt = cls(groups, foreach=foreach, fused=fused, **hp)
    for grads in gradients():
        for p, g in zip(params, grads):
            p.grad = g.cuda()
        opt.step()
    torch.cuda.synchronize()
    return params, opt


def assert_weights_close(actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        dtype = PARAMS[i][1]
        assert a.dtype == dtype and a.is_cuda, i
        tol = BF16 if dtype == torch.bfloat16 else FP32
        torch.testing.assert_close(
            a.detach().cpu().to(torch.float64),
            e.detach().cpu().to(torch.float64),
            **tol,
            msg=lambda text, i=i: f"parameter {i}: {text}",
        )


@pytest.mark.parametrize("case", list(CASES))
def test_foreach_per_tensor_and_float64_reference_agree_on_cuda(case):
    fast, opt_fast = run_on_cuda(case, foreach=True)
    slow, _ = run_on_cuda(case, foreach=False)
    expected = reference(case)
    assert_weights_close(fast, [p.detach() for p in slow])
    assert_weights_close(fast, expected)
    assert_weights_close(slow, expected)
    # the state of bf16 parameters is fp32, on the GPU
    for p in fast:
        for value in opt_fast.state[p].values():
            if torch.is_tensor(value) and value.is_floating_point():
                assert value.is_cuda
                assert value.dtype == (torch.float32 if p.dtype == torch.bfloat16 else p.dtype)
    # the weights moved: each by well over the tolerance (the zero tensor included)
    for p, w in zip(fast, initial_weights()):
        assert (p.detach().cpu().double() - w.double()).abs().max() > 1e-2


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_step_agrees_with_the_float64_reference_on_cuda(case):
    """fused=True on CUDA: Triton kernels from largedet.optim._compiled, the strided
    parameter on the eager path, the same state layout as the eager step's."""
    compiled, opt_compiled = run_on_cuda(case, foreach=None, fused=True)
    eager, opt_eager = run_on_cuda(case, foreach=True)
    assert_weights_close(compiled, reference(case))
    assert_weights_close(compiled, [p.detach() for p in eager])
    for a, b in zip(compiled, eager):
        for key, value in opt_eager.state[b].items():
            other = opt_compiled.state[a][key]
            assert type(other) is type(value), key
            if isinstance(value, torch.Tensor):
                assert (other.dtype, other.shape, other.is_cuda) == (value.dtype, value.shape, True)
