"""The linear scaling rule with warmup: hand-computed LR sequences, one schedule object."""

import pytest
from torch import nn

from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.solver import build_lr_scheduler, build_optimizer, lr_scaling, run_plan, with_scaled_lr


def make_cfg(*opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list([str(o) if not isinstance(o, str) else o for o in opts])
    cfg.freeze()
    return cfg


class TwoGroups(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)  # weight (decayed) and bias: two parameter groups


def lr_sequence(cfg):
    """The LR of each parameter group during iterations 0 .. MAX_ITER - 1."""
    model = TwoGroups()
    plan = run_plan(cfg, 1)
    optimizer = build_optimizer(with_scaled_lr(cfg, plan.lr), model)
    scheduler = build_lr_scheduler(cfg, optimizer, plan)
    seq = []
    for _ in range(cfg.SOLVER.MAX_ITER):
        seq.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return seq


def test_linear_rule_with_linear_warmup_and_steps():
    cfg = make_cfg(
        "SOLVER.LSR.ENABLED", "True", "SOLVER.LSR.RULE", "linear",
        "SOLVER.LSR.REFERENCE_BATCH", 256, "SOLVER.LSR.REFERENCE_LR", 0.1, "SOLVER.IMS_PER_BATCH", 1024,
        "SOLVER.BASE_LR", 7.0,  # replaced by the rule
        "SOLVER.WARMUP_ITERS", 4, "SOLVER.WARMUP_FACTOR", 0.25, "SOLVER.STEPS", "(6,)", "SOLVER.GAMMA", 0.1,
        "SOLVER.MAX_ITER", 8,
    )  # fmt: skip
    # peak 0.1 x 1024 / 256 = 0.4; warmup factor 0.25 + 0.75 t / 4 for t < 4; x0.1 from t = 6
    expected = [0.1, 0.175, 0.25, 0.325, 0.4, 0.4, 0.04, 0.04]
    assert [lrs[0] for lrs in lr_sequence(cfg)] == pytest.approx(expected, rel=1e-12)
    scaling = lr_scaling(cfg)
    assert (scaling.lr, scaling.rule, scaling.reference_lr, scaling.reference_batch) == (
        pytest.approx(0.4),
        "linear",
        0.1,
        256,
    )
    assert (
        "0.4 = linear scaling rule: reference LR 0.1 at batch 256 x 1024 / 256"
        in scaling.describe()
    )


def test_sqrt_rule_and_bias_lr_factor():
    cfg = make_cfg(
        "SOLVER.LSR.ENABLED", "True", "SOLVER.LSR.RULE", "sqrt",
        "SOLVER.LSR.REFERENCE_BATCH", 16, "SOLVER.LSR.REFERENCE_LR", 0.001, "SOLVER.IMS_PER_BATCH", 1024,
        "SOLVER.BIAS_LR_FACTOR", 2.0,
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.5, "SOLVER.STEPS", "()", "SOLVER.MAX_ITER", 4,
    )  # fmt: skip
    # peak 0.001 x sqrt(1024 / 16) = 0.008; warmup 0.5, 0.75; biases at twice the LR
    seq = lr_sequence(cfg)
    weight_lrs = sorted(seq[0])
    assert weight_lrs == pytest.approx([0.004, 0.008])
    assert [min(lrs) for lrs in seq] == pytest.approx([0.004, 0.006, 0.008, 0.008], rel=1e-12)
    assert [max(lrs) for lrs in seq] == pytest.approx([0.008, 0.012, 0.016, 0.016], rel=1e-12)


def test_disabled_rule_keeps_base_lr():
    cfg = make_cfg(
        "SOLVER.LSR.REFERENCE_LR", 0.5, "SOLVER.BASE_LR", 0.02, "SOLVER.IMS_PER_BATCH", 64,
        "SOLVER.WARMUP_ITERS", 1, "SOLVER.WARMUP_FACTOR", 0.1, "SOLVER.STEPS", "()", "SOLVER.MAX_ITER", 3,
    )  # fmt: skip
    assert with_scaled_lr(cfg, lr_scaling(cfg)) is cfg
    assert [lrs[0] for lrs in lr_sequence(cfg)] == pytest.approx([0.002, 0.02, 0.02], rel=1e-12)
    assert lr_scaling(cfg).describe() == "LR 0.02 (SOLVER.BASE_LR; linear scaling rule disabled)"


def test_cosine_end_lr_is_relative_to_the_scaled_lr():
    cfg = make_cfg(
        "SOLVER.LSR.ENABLED", "True", "SOLVER.LSR.REFERENCE_BATCH", 16, "SOLVER.LSR.REFERENCE_LR", 0.02,
        "SOLVER.IMS_PER_BATCH", 64, "SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR", "SOLVER.BASE_LR_END", 0.001,
        "SOLVER.WARMUP_ITERS", 0, "SOLVER.MAX_ITER", 4,
    )  # fmt: skip
    # peak 0.08; cosine from 0.08 to 0.001: 0.001 + (0.08 - 0.001) (1 + cos(pi t / 4)) / 2
    expected = [0.08, 0.001 + 0.079 * (1 + 2**-0.5) / 2, 0.0405, 0.001 + 0.079 * (1 - 2**-0.5) / 2]
    assert [lrs[0] for lrs in lr_sequence(cfg)] == pytest.approx(expected, rel=1e-9)


def test_the_copy_for_builders_leaves_the_config_alone():
    cfg = make_cfg("SOLVER.LSR.ENABLED", "True", "SOLVER.IMS_PER_BATCH", 32, "SOLVER.BASE_LR", 0.3)
    scaled = with_scaled_lr(cfg, lr_scaling(cfg))
    assert scaled.SOLVER.BASE_LR == pytest.approx(0.04) and cfg.SOLVER.BASE_LR == 0.3
    assert scaled.is_frozen()


@pytest.mark.parametrize(
    "opts, match",
    [
        (["SOLVER.LSR.RULE", "cubic"], "SOLVER.LSR.RULE"),
        (["SOLVER.LSR.REFERENCE_BATCH", 0], "SOLVER.LSR.REFERENCE_BATCH"),
        (["SOLVER.LSR.REFERENCE_LR", 0.0], "SOLVER.LSR.REFERENCE_LR"),
    ],
)
def test_invalid_rule_settings_are_named_by_the_declared_rules(opts, match):
    # one check of each value, before launch and when a trainer is built; lr_scaling trusts it
    from largedet.config.validate import ConfigError, check_values

    with pytest.raises(ConfigError, match=match):
        check_values(make_cfg("SOLVER.LSR.ENABLED", "True", *opts))


def test_one_scheduler_owns_the_lr():
    # the schedule is Detectron2's LRMultiplier: the optimizer's LR is always its value
    cfg = make_cfg("SOLVER.LSR.ENABLED", "True", "SOLVER.MAX_ITER", 5, "SOLVER.WARMUP_ITERS", 3)
    plan = run_plan(cfg, 1)
    optimizer = build_optimizer(with_scaled_lr(cfg, plan.lr), TwoGroups())
    scheduler = build_lr_scheduler(cfg, optimizer, plan)
    from detectron2.solver import LRMultiplier

    assert isinstance(scheduler, LRMultiplier)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        assert [g["lr"] for g in optimizer.param_groups] == scheduler.get_last_lr()


def test_a_short_warmup_stable_decay_run_reaches_its_peak_lr():
    """WARMUP_ITERS >= MAX_ITER with warm-up-stable-decay: the warm-up is shortened to the 8
    steps before the decay (DECAY_START 0.8 x 10), so it ends at the peak LR 0.02 at step 8,
    from which the decay falls linearly towards BASE_LR_END at step 10."""
    from largedet.solver import warmup_steps
    from largedet.solver.plan import describe_warmup

    cfg = make_cfg(
        "SOLVER.BASE_LR", 0.02, "SOLVER.BASE_LR_END", 0.002, "SOLVER.LR_SCHEDULER_NAME", "WarmupStableDecayLR",
        "SOLVER.WSD.DECAY_START", 0.8, "SOLVER.WARMUP_ITERS", 10, "SOLVER.WARMUP_FACTOR", 0.1,
        "SOLVER.MAX_ITER", 10, "SOLVER.IMS_PER_BATCH", 2, "SOLVER.IMS_PER_DEVICE", 2,
    )  # fmt: skip
    # warm-up: 0.02 x (0.1 + 0.9 k / 8) for k < 8; step 9: 0.02 x (1 - 0.9 x (0.9 - 0.8) / 0.2)
    expected = [0.002, 0.00425, 0.0065, 0.00875, 0.011, 0.01325, 0.0155, 0.01775, 0.02, 0.011]
    assert [lrs[0] for lrs in lr_sequence(cfg)] == pytest.approx(expected, rel=1e-12)
    plan = run_plan(cfg, 1)
    assert warmup_steps(cfg, 10) == plan.warmup_iters == 8
    assert describe_warmup(cfg, plan.warmup_iters, 0.02) == (
        "linear warmup over 8 iterations from 0.1 x LR = 0.002 to 0.02 (SOLVER.WARMUP_ITERS 10 "
        "shortened: it ends at the peak LR within the run, before the decay at 0.8 of it)"
    )


@pytest.mark.parametrize(
    "schedule, warmup, max_iter, decay_start, steps",
    [
        ("WarmupStableDecayLR", 3, 10, 0.8, 3),  # ends before the decay: as configured
        ("WarmupStableDecayLR", 9, 10, 0.5, 5),  # would end inside the decay
        ("WarmupStableDecayLR", 5, 1, 0.8, 0),  # no step before the decay: none
        ("WarmupCosineLR", 12, 10, 0.8, 10),  # Detectron2's shapes: at most the run
        ("WarmupMultiStepLR", 4, 10, 0.1, 4),
    ],
)
def test_warmup_steps(schedule, warmup, max_iter, decay_start, steps):
    from largedet.solver import warmup_steps

    cfg = make_cfg("SOLVER.LR_SCHEDULER_NAME", schedule, "SOLVER.WARMUP_ITERS", warmup,
                   "SOLVER.WSD.DECAY_START", decay_start, "SOLVER.STEPS", "()")  # fmt: skip
    assert warmup_steps(cfg, max_iter) == steps
