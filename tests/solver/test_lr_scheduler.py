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


# --- the one builder: every shape after the plan's warm-up ---------------------------------


def scheduled_lrs(scheduler, steps):
    """The first group's LR at steps 0 .. steps - 1 (the schedule is not stepped past the last)."""
    lrs = [scheduler.optimizer.param_groups[0]["lr"]]
    for _ in range(steps - 1):
        scheduler.optimizer.step()
        scheduler.step()
        lrs.append(scheduler.optimizer.param_groups[0]["lr"])
    return lrs


def test_step_with_fixed_gamma_after_warmup():
    cfg = make_cfg(
        "SOLVER.BASE_LR", 0.1, "SOLVER.LR_SCHEDULER_NAME", "WarmupStepWithFixedGammaLR", "SOLVER.GAMMA", 0.5,
        "SOLVER.NUM_DECAYS", 2, "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.5, "SOLVER.MAX_ITER", 8,
    )  # fmt: skip
    # three equal thirds of 8 steps: x1 for t < 8/3, x0.5 for t < 16/3, x0.25 after; the
    # warm-up from 0.5 x 0.1 to the shape's value 0.1 at step 2
    expected = [0.05, 0.075, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025]
    plan = run_plan(cfg, 1)
    scheduler = build_lr_scheduler(cfg, build_optimizer(cfg, TwoGroups()), plan)
    assert scheduled_lrs(scheduler, 8) == pytest.approx(expected, rel=1e-12)
    # the trainer steps the scheduler once more after the last step (progress 1): the last
    # step's LR, where fvcore's shape alone raises an IndexError
    scheduler.optimizer.step()
    scheduler.step()
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(0.025, rel=1e-12)


@pytest.mark.parametrize(
    "rescale, expected",
    [
        # under the shape: the warm-up ends at the cosine's value at step 2 of 4, 0.05
        (False, [0.05, 0.05, 0.05, 0.05 * (1 - 2**-0.5)]),
        # before the shape: the warm-up ends at its first value, the cosine spans steps 2-4
        (True, [0.05, 0.075, 0.1, 0.05]),
    ],
)
def test_cosine_after_warmup_with_and_without_a_rescaled_interval(rescale, expected):
    cfg = make_cfg(
        "SOLVER.BASE_LR", 0.1, "SOLVER.BASE_LR_END", 0.0, "SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR",
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.5, "SOLVER.RESCALE_INTERVAL", rescale,
        "SOLVER.MAX_ITER", 4,
    )  # fmt: skip
    assert [lrs[0] for lrs in lr_sequence(cfg)] == pytest.approx(expected, rel=1e-12)


def test_any_shape_takes_the_plans_warmup_through_the_one_builder():
    # a LazyConfig's lr_multiplier or multigrid's stages: any fvcore shape
    from fvcore.common.param_scheduler import MultiStepParamScheduler

    from largedet.solver import build_schedule

    cfg = make_cfg("SOLVER.BASE_LR", 1.0, "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.2,
                   "SOLVER.RESCALE_INTERVAL", True, "SOLVER.MAX_ITER", 5)  # fmt: skip
    plan = run_plan(cfg, 1)
    shape = MultiStepParamScheduler(values=[1.0, 0.1], milestones=[3], num_updates=5)
    optimizer = build_optimizer(cfg, TwoGroups())
    # the shape at fixed steps (rescale_interval=False whatever SOLVER.RESCALE_INTERVAL says)
    scheduler = build_schedule(cfg, optimizer, shape, plan, rescale_interval=False)
    assert scheduled_lrs(scheduler, 5) == pytest.approx([0.2, 0.6, 1.0, 0.1, 0.1], rel=1e-12)


def test_a_run_of_its_own_length_has_its_warmup_within_it():
    from largedet.solver import with_run_length

    cfg = make_cfg("SOLVER.BASE_LR", 0.1, "SOLVER.WARMUP_ITERS", 6, "SOLVER.WARMUP_FACTOR", 0.5,
                   "SOLVER.STEPS", "()", "SOLVER.MAX_ITER", 10)  # fmt: skip
    plan = run_plan(cfg, 1)
    assert plan.warmup_iters == 6 and with_run_length(plan, cfg, 10) is plan
    short = with_run_length(plan, cfg, 4)
    assert (short.warmup_iters, short.max_iter) == (4, 10)
    optimizer = build_optimizer(cfg, TwoGroups())
    scheduler = build_lr_scheduler(cfg, optimizer, short, 4)
    assert scheduled_lrs(scheduler, 4) == pytest.approx([0.05, 0.0625, 0.075, 0.0875], rel=1e-12)


def test_one_module_builds_the_warmup_and_the_lr_multiplier():
    """Detectron2's WarmupParamScheduler and LRMultiplier are made in one place, for the yacs
    path, the LazyConfig path and the video project alike."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    builders = re.compile(r"\b(WarmupParamScheduler|LRMultiplier)\(")
    makers = {
        str(path.relative_to(root))
        for folder in ("largedet", "projects/video/largedet_video")
        for path in (root / folder).rglob("*.py")
        if builders.search(path.read_text())
    }
    assert makers == {"largedet/solver/lr_scheduler.py"}
