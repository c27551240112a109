"""build_optimizer: SOLVER.OPTIMIZER from yaml, parameter groups, clipping, user registration."""

import inspect
import os
import re

import pytest
import torch
from torch import nn

from detectron2.config import get_cfg
from largedet import optim
from largedet.config import add_largedet_config
from largedet.config.defaults import _add_solver_config
from largedet.solver import OPTIMIZER_REGISTRY, build_optimizer, get_optimizer_params

YAML = """
SOLVER:
  OPTIMIZER: "{name}"
  BASE_LR: 0.004
  WEIGHT_DECAY: 0.05
  MOMENTUM: 0.8
  LAMB:
    BETAS: [0.8, 0.95]
    EPS: 1.0e-7
    MAX_TRUST_RATIO: 5.0
  PMD:
    PERIOD: 30
    DECAY: "linear"
  LARS:
    ETA: 0.02
"""


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4, 2)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        x = self.gn(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.frozen(self.fc(x))


def make_cfg(tmp_path, name, *opts):
    cfg = add_largedet_config(get_cfg())
    path = tmp_path / f"{name}.yaml"
    path.write_text(YAML.format(name=name))
    cfg.merge_from_file(str(path))
    cfg.merge_from_list(list(opts))
    return cfg


def hyper_of(optimizer, model):
    """parameter name -> (weight_decay, adapt or None)."""
    names = {p: n for n, p in model.named_parameters()}
    return {
        names[p]: (g["weight_decay"], g.get("adapt"))
        for g in optimizer.param_groups
        for p in g["params"]
    }


DECAYED = {"conv.weight", "fc.weight"}
TRAINABLE = {
    "conv.weight",
    "conv.bias",
    "bn.weight",
    "bn.bias",
    "gn.weight",
    "gn.bias",
    "fc.weight",
    "fc.bias",
}

EXPECTED = {
    "SGD": (torch.optim.SGD, dict(lr=0.004, momentum=0.8, nesterov=False)),
    "AdamW": (torch.optim.AdamW, dict(lr=0.004, betas=(0.9, 0.999), eps=1e-8)),
    "LAMB": (
        optim.LAMB,
        dict(lr=0.004, betas=(0.8, 0.95), eps=1e-7, max_trust_ratio=5.0, decay="none"),
    ),
    "PMD_LAMB": (
        optim.PMDLAMB,
        dict(lr=0.004, betas=(0.8, 0.95), eps=1e-7, max_trust_ratio=5.0, period=30, decay="linear"),
    ),
    "LARS": (optim.LARS, dict(lr=0.004, momentum=0.8, eta=0.02)),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builds_each_optimizer_from_yaml(tmp_path, name):
    model = Tiny()
    optimizer = build_optimizer(make_cfg(tmp_path, name), model)
    cls, hyper = EXPECTED[name]
    assert type(optimizer) is cls
    for group in optimizer.param_groups:
        for key, value in hyper.items():
            assert group[key] == value, key
    adaptive = name in ("LAMB", "PMD_LAMB", "LARS")
    expected = {
        n: (0.05 if n in DECAYED else 0.0, (n in DECAYED) if adaptive else None) for n in TRAINABLE
    }
    assert hyper_of(optimizer, model) == expected
    assert len(optimizer.param_groups) == 2  # merged by reduce_param_groups


def explicit_groups(model, adaptive):
    decayed = [model.conv.weight, model.fc.weight]
    rest = [p for n, p in model.named_parameters() if n in TRAINABLE and n not in DECAYED]
    extra = ({"adapt": True}, {"adapt": False}) if adaptive else ({}, {})
    return [
        {"params": decayed, "weight_decay": 0.05, **extra[0]},
        {"params": rest, "weight_decay": 0.0, **extra[1]},
    ]


MANUAL = {
    "SGD": lambda g: torch.optim.SGD(g, lr=0.004, momentum=0.8),
    "AdamW": lambda g: torch.optim.AdamW(g, lr=0.004),
    "LAMB": lambda g: optim.LAMB(g, lr=0.004, betas=(0.8, 0.95), eps=1e-7, max_trust_ratio=5.0),
    "PMD_LAMB": lambda g: optim.PMDLAMB(
        g, lr=0.004, betas=(0.8, 0.95), eps=1e-7, max_trust_ratio=5.0, period=30, decay="linear"
    ),
    "LARS": lambda g: optim.LARS(g, lr=0.004, momentum=0.8, eta=0.02),
}


@pytest.mark.parametrize("name", sorted(MANUAL))
def test_built_optimizer_trains_like_the_explicit_one(tmp_path, name):
    torch.manual_seed(0)
    a = Tiny()
    b = Tiny()
    b.load_state_dict(a.state_dict())
    opt_a = build_optimizer(make_cfg(tmp_path, name), a)
    opt_b = MANUAL[name](explicit_groups(b, name in ("LAMB", "PMD_LAMB", "LARS")))
    x = torch.randn(2, 3, 6, 6)
    for _ in range(3):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n
    assert not torch.equal(a.conv.weight, Tiny().conv.weight)


def test_norm_and_bias_adaptation_and_decay_are_configurable(tmp_path):
    model = Tiny()
    cfg = make_cfg(
        tmp_path, "PMD_LAMB", "SOLVER.ADAPT_NORM", "True", "SOLVER.WEIGHT_DECAY_NORM", "0.01"
    )
    got = hyper_of(build_optimizer(cfg, model), model)
    assert got["bn.weight"] == (0.01, True) and got["gn.weight"] == (0.01, True)
    assert got["bn.bias"] == (0.0, False)  # a bias: SOLVER.ADAPT_BIAS and WEIGHT_DECAY_BIAS win
    assert got["conv.bias"] == (0.0, False)

    cfg = make_cfg(
        tmp_path, "LARS", "SOLVER.ADAPT_BIAS", "True", "SOLVER.WEIGHT_DECAY_BIAS", "None"
    )
    got = hyper_of(build_optimizer(cfg, model), model)
    assert got["conv.bias"] == (0.05, True) and got["fc.bias"] == (0.05, True)
    assert got["bn.weight"] == (0.0, False)


def test_detectron2_backbone_groups(tmp_path):
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import build_backbone

    cfg = make_cfg(
        tmp_path,
        "PMD_LAMB",
        "MODEL.RESNETS.DEPTH",
        "18",
        "MODEL.RESNETS.RES2_OUT_CHANNELS",
        "64",
        "MODEL.RESNETS.NORM",
        "BN",
        "MODEL.BACKBONE.FREEZE_AT",
        "2",
    )
    backbone = build_backbone(cfg, ShapeSpec(channels=3))
    groups = get_optimizer_params(cfg, backbone, layer_adaptive=True)
    trainable = [p for p in backbone.parameters() if p.requires_grad]
    assert (
        sum(len(g["params"]) for g in groups) == len(trainable) < len(list(backbone.parameters()))
    )
    norm = {
        id(m.weight)
        for m in backbone.modules()
        if isinstance(m, torch.nn.BatchNorm2d) and m.weight.requires_grad
    }
    assert norm
    for group in groups:
        for p in group["params"]:
            assert group["adapt"] is (
                p.dim() == 4
            )  # conv weights adapt, BN weights and biases do not
            assert (id(p) in norm) <= (group["weight_decay"] == 0.0)


def test_gradient_clipping_still_applies(tmp_path):
    torch.manual_seed(0)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    cfg = make_cfg(
        tmp_path,
        "PMD_LAMB",
        "SOLVER.CLIP_GRADIENTS.ENABLED",
        "True",
        "SOLVER.CLIP_GRADIENTS.CLIP_TYPE",
        "value",
        "SOLVER.CLIP_GRADIENTS.CLIP_VALUE",
        "0.01",
    )
    clipped = build_optimizer(cfg, a)
    assert isinstance(clipped, optim.PMDLAMB) and type(clipped) is not optim.PMDLAMB
    plain = build_optimizer(make_cfg(tmp_path, "PMD_LAMB"), b)
    x = torch.randn(2, 3, 6, 6)
    for model in (a, b):
        (100 * model(x).pow(2).sum()).backward()
    assert max(p.grad.abs().max() for p in b.parameters() if p.grad is not None) > 0.01
    for p in b.parameters():
        if p.grad is not None:
            p.grad.clamp_(-0.01, 0.01)
    clipped.step()
    plain.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_user_registered_optimizer(tmp_path):
    name = "RAdamForTest"

    def RAdamForTest(cfg, model):  # noqa: N802
        return torch.optim.RAdam(get_optimizer_params(cfg, model), lr=cfg.SOLVER.BASE_LR)

    OPTIMIZER_REGISTRY.register(RAdamForTest)
    try:
        optimizer = build_optimizer(make_cfg(tmp_path, name), Tiny())
        assert type(optimizer) is torch.optim.RAdam and optimizer.param_groups[0]["lr"] == 0.004
    finally:  # the registry is global: other tests list its names
        OPTIMIZER_REGISTRY._obj_map.pop(name, None)


README = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "training.md")


def readme_registry_example() -> str:
    """The first ``python`` block of the "Optimizers" section of the training manual."""
    with open(README) as f:
        text = f.read()
    section = text[text.index("## Optimizers") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_registry_example_builds_and_steps(tmp_path):
    code = readme_registry_example()
    assert "OPTIMIZER_REGISTRY.register()" in code and "def MyOpt(cfg, model)" in code
    assert "MyOpt" not in OPTIMIZER_REGISTRY
    try:
        exec(compile(code, README, "exec"), {})
        model = Tiny()
        optimizer = build_optimizer(make_cfg(tmp_path, "MyOpt"), model)
        assert type(optimizer) is torch.optim.RAdam
        assert {g["lr"] for g in optimizer.param_groups} == {0.004}
        assert hyper_of(optimizer, model) == {
            n: (0.05 if n in DECAYED else 0.0, None) for n in TRAINABLE
        }
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.randn(2, 3, 8, 8)).square().sum().backward()
        optimizer.step()
        changed = {n for (n, p), b in zip(model.named_parameters(), before) if not torch.equal(p, b)}
        # conv.bias feeds a BatchNorm in training mode: its gradient is zero.
        assert changed == TRAINABLE - {"conv.bias"}
    finally:
        OPTIMIZER_REGISTRY._obj_map.pop("MyOpt", None)


def test_unknown_optimizer_name(tmp_path):
    with pytest.raises(KeyError, match="NoSuchOptimizer"):
        build_optimizer(make_cfg(tmp_path, "NoSuchOptimizer"), Tiny())


def test_defaults_and_every_key_commented():
    cfg = add_largedet_config(get_cfg())
    assert cfg.SOLVER.OPTIMIZER == "SGD"
    assert (cfg.SOLVER.PMD.PERIOD, cfg.SOLVER.PMD.DECAY) == (200, "cosine")
    assert (tuple(cfg.SOLVER.LAMB.BETAS), cfg.SOLVER.LAMB.EPS, cfg.SOLVER.LAMB.MAX_TRUST_RATIO) == (
        (0.9, 0.999),
        1e-6,
        10.0,
    )
    assert (cfg.SOLVER.ADAPT_NORM, cfg.SOLVER.ADAPT_BIAS, cfg.SOLVER.WEIGHT_DECAY_BIAS) == (
        False,
        False,
        0.0,
    )
    lines = inspect.getsource(_add_solver_config).splitlines()
    keys = 0
    for i, line in enumerate(lines):
        # a key set directly or declared with its rule (largedet.config.keys.declare)
        if re.match(r"\s*(cfg\.SOLVER\.[\w.]+ = (?!CN\(\))|declare\()", line):
            keys += 1
            assert lines[i - 1].strip().startswith("#"), line
    assert keys >= 10


def test_built_in_optimizers_are_a_table_entered_by_one_call():
    """The built-in builders are data (:data:`BUILT_IN_OPTIMIZERS`, each under its function's
    name); :func:`register_built_in_optimizers` enters them into a registry, any registry,
    once: a second call adds nothing and does not fail."""
    from fvcore.common.registry import Registry

    from largedet.solver import BUILT_IN_OPTIMIZERS, register_built_in_optimizers

    assert sorted(BUILT_IN_OPTIMIZERS) == ["AdamW", "LAMB", "LARS", "PMD_LAMB", "SGD"]
    assert all(builder.__name__ == name for name, builder in BUILT_IN_OPTIMIZERS.items())
    assert all(OPTIMIZER_REGISTRY.get(name) is b for name, b in BUILT_IN_OPTIMIZERS.items())
    fresh = Registry("OPTIMIZER_FOR_TEST")
    register_built_in_optimizers(fresh)
    register_built_in_optimizers(fresh)
    assert dict(fresh) == BUILT_IN_OPTIMIZERS
