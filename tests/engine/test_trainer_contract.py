"""The trainers keep Detectron2's ``DefaultTrainer`` contract: the builders and ``test`` are
classmethods of the config with ``DefaultTrainer``'s parameters (largedet's extra ones come
after, with defaults), so a ``DefaultTrainer`` subclass's habits carry over and one
``train_or_evaluate`` serves every trainer; the parts a trainer is built from (a yacs
config's, a LazyConfig's) have the same methods with the same parameters, and a LazyConfig
is trained by the same class; the peak LR is computed once per trainer; the trainer is
wiring, with few members."""

import inspect
import math
import os

import pytest
import torch
from engine_testing import tiny_cfg
from torch import nn

import largedet  # noqa: F401
from detectron2.config import LazyConfig
from detectron2.engine import DefaultTrainer
from largedet.engine import Trainer
from largedet.engine.lazy import LazyParts
from largedet.engine.parts import TrainerParts
from largedet.solver import run_plan

BUILDERS = (
    "build_model",
    "build_optimizer",
    "build_lr_scheduler",
    "build_train_loader",
    "build_test_loader",
    "build_evaluator",
    "test",
)
# the builders of what the run plan's numbers decide: the peak LR, the schedule's steps
PLANNED = ("build_optimizer", "build_lr_scheduler")
LAZY = os.path.join(
    os.path.dirname(__file__), "..", "..", "configs", "shapes", "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py"
)


def trainer_classes():
    from largedet_video.engine import VideoTrainer

    return [Trainer, VideoTrainer]


#: the builders a trainer's parts have, with the parameters of DefaultTrainer's (but ``cls``)
PARTS = ("build_model", "build_optimizer", "build_lr_scheduler", "build_train_loader", "test")


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_are_classmethods_with_detectron2s_parameters(name):
    d2 = list(inspect.signature(getattr(DefaultTrainer, name)).parameters.values())
    for cls in trainer_classes():
        assert isinstance(inspect.getattr_static(cls, name), classmethod), (cls, name)
        ours = list(inspect.signature(getattr(cls, name)).parameters.values())
        assert [p.name for p in ours[: len(d2)]] == [p.name for p in d2], (cls, name)
        # what largedet adds can be left out, as a Detectron2 caller does, except the run
        # plan, which every builder of a derived number takes and none recomputes
        extra = ours[len(d2):]
        assert all(p.default is not inspect.Parameter.empty for p in extra if p.name != "plan"), (cls, name)
        plan = [p for p in extra if p.name == "plan"]
        assert [p.default for p in plan] == ([inspect.Parameter.empty] if name in PLANNED else []), (cls, name)


def test_the_trainer_is_a_trainerbase_with_defaulttrainers_interface():
    """Not a DefaultTrainer subclass (whose __init__, loop and inner trainer it would replace),
    but every public name of DefaultTrainer's is there, except its worker auto-scaling (the
    run plan's K keeps the global batch on any number of devices instead)."""
    from detectron2.engine import TrainerBase

    public = {n for n in vars(DefaultTrainer) if not n.startswith("_")} - {"auto_scale_workers"}
    for cls in trainer_classes():
        assert issubclass(cls, TrainerBase) and not issubclass(cls, DefaultTrainer), cls
        assert all(hasattr(cls, n) for n in public), (cls, sorted(n for n in public if not hasattr(cls, n)))
    assert {"model", "optimizer", "data_loader"} <= public


def test_build_lr_scheduler_of_the_run_plan_is_the_configs_schedule(tmp_path):
    # no warm-up, cosine over SOLVER.MAX_ITER = 10 steps from 0.1: 0.1 (1 + cos(pi i / 10)) / 2
    cfg = tiny_cfg(
        str(tmp_path), "SOLVER.MAX_ITER", 10, "SOLVER.WARMUP_ITERS", 0,
        "SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR",
    )  # fmt: skip
    model = nn.Linear(2, 2)
    plan = run_plan(cfg, 1)
    optimizer = Trainer.build_optimizer(cfg, model, plan)
    scheduler = Trainer.build_lr_scheduler(cfg, optimizer, plan)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.1 * (1 + math.cos(math.pi * i / 10)) / 2 for i in range(10)], rel=1e-12)


def test_build_lr_scheduler_of_a_batch_ramp_needs_the_run_plan(tmp_path):
    cfg = tiny_cfg(str(tmp_path), "SOLVER.BATCH_RAMP.BATCHES", (2,), "SOLVER.BATCH_RAMP.EPOCHS", (1.0,))
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(TypeError, match="plan"):  # the run plan is a required argument
        Trainer.build_lr_scheduler(cfg, optimizer)


@pytest.mark.parametrize("name", PARTS)
def test_each_forms_parts_have_the_builders_parameters(name):
    d2 = [p.name for p in inspect.signature(getattr(DefaultTrainer, name)).parameters.values()]
    planned = [p.name for p in inspect.signature(getattr(Trainer, name)).parameters.values()]
    for parts in (TrainerParts(Trainer), LazyParts(LazyConfig.load(LAZY))):
        ours = [p.name for p in inspect.signature(getattr(parts, name)).parameters.values()]
        assert ours[: len(d2)] == d2 and ours == planned, (type(parts).__name__, name)


def test_a_yacs_config_and_a_lazyconfig_are_trained_by_one_class_made_before_the_run():
    """No trainer class is made at run time: the LazyConfig's parts are an argument."""
    import largedet.engine.lazy as lazy

    trainer_classes = [v for v in vars(lazy).values() if isinstance(v, type) and issubclass(v, Trainer)]
    assert trainer_classes == [Trainer]
    assert "parts" in inspect.signature(Trainer).parameters
    cfg = LazyConfig.load(LAZY)
    parts = LazyParts(cfg)
    assert parts.lazy is cfg and parts.value_rules == lazy.LAZY_RULES
    assert {r.key for r in TrainerParts(Trainer).value_rules} - {r.key for r in parts.value_rules} == {
        "SOLVER.LR_SCHEDULER_NAME"
    }


class OwnModel(Trainer):
    built = []

    @classmethod
    def build_model(cls, cfg):
        cls.built.append(cfg.OUTPUT_DIR)
        return super().build_model(cfg)


def test_a_subclass_that_overrides_a_builder_is_served_by_it(tiny_shapes, tmp_path):
    """As with Detectron2's DefaultTrainer: a subclass's ``build_model`` builds its model."""
    trainer = OwnModel(tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 1))
    assert OwnModel.built == [str(tmp_path)] and type(trainer.parts) is TrainerParts
    assert trainer.parts.trainer_cls is OwnModel


#: Trainer's own members: Detectron2's DefaultTrainer interface (its builders, hooks,
#: writers, resume, loop and state) and the rollback; the rest lives in named collaborators
MAX_TRAINER_MEMBERS = 20


def test_the_trainer_is_wiring_with_few_members():
    members = [m for m in vars(Trainer) if not m.startswith("__")]
    assert len(members) <= MAX_TRAINER_MEMBERS, members


def test_the_trainer_computes_the_peak_lr_once_and_the_optimizer_and_schedule_hold_it(tiny_shapes, tmp_path, monkeypatch):
    from largedet.solver import plan

    # the one module that computes it (the run plan's), once; the builders read the plan
    calls = []
    real = plan.lr_scaling
    monkeypatch.setattr(plan, "lr_scaling", lambda cfg: calls.append(1) or real(cfg))
    cfg = tiny_cfg(
        str(tmp_path), "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.RULE", "sqrt",
        "SOLVER.LSR.REFERENCE_BATCH", 1, "SOLVER.LSR.REFERENCE_LR", 0.01,
    )  # fmt: skip
    trainer = Trainer(cfg)
    assert len(calls) == 1
    # sqrt(4 / 1) x 0.01; the optimizer's groups start from it (warm-up factor 0.5 at step 0)
    assert trainer.plan.lr.lr == pytest.approx(0.02, rel=1e-12)
    assert trainer.scheduler.base_lrs[0] == pytest.approx(0.02, rel=1e-12)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01, rel=1e-12)
