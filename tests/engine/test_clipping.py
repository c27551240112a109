"""One clipping path: the training loop applies Detectron2's ``SOLVER.CLIP_GRADIENTS`` itself
(from the run plan), with the same result as Detectron2's optimizer wrapper; largedet's
trainer builds its optimizer unwrapped, a Detectron2 trainer still gets the wrapper."""

import copy

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.solver.build import maybe_add_gradient_clipping
from detectron2.utils.events import EventStorage
from engine_testing import tiny_cfg
from torch import nn

from largedet.config import add_largedet_config
from largedet.engine import Trainer
from largedet.engine.train_loop import AccumulationTrainer, StepPlan
from largedet.solver import build_optimizer, run_plan


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x):
        return {"loss": 40 * self.b(torch.tanh(self.a(x))).pow(2).mean()}


def clip_cfg(kind, value, norm_type=2.0):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list([
        "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 4, "SOLVER.CLIP_GRADIENTS.ENABLED", True,
        "SOLVER.CLIP_GRADIENTS.CLIP_TYPE", kind, "SOLVER.CLIP_GRADIENTS.CLIP_VALUE", value,
        "SOLVER.CLIP_GRADIENTS.NORM_TYPE", norm_type,
    ])  # fmt: skip
    return cfg


@pytest.mark.parametrize(
    "kind, value, norm_type",
    [("value", 0.05, 2.0), ("norm", 0.2, 2.0), ("norm", 0.1, float("inf")), ("norm", 0.3, 1.0), ("full_model", 0.25, 2.0)],
)
def test_the_loops_clip_equals_detectron2s_wrapper(kind, value, norm_type):
    torch.manual_seed(0)
    ours = Net().double()
    theirs = copy.deepcopy(ours)
    x = torch.randn(8, 6, dtype=torch.float64)
    cfg = clip_cfg(kind, value, norm_type)
    plan = run_plan(cfg, 1)

    # Detectron2's path: one batch of 8, its clipping wrapper around SGD ("full_model", which
    # Detectron2's projects add: torch's clip_grad_norm_ over all parameters)
    if kind == "full_model":
        wrapped = torch.optim.SGD(theirs.parameters(), lr=0.5)
    else:
        wrapped = maybe_add_gradient_clipping(cfg, torch.optim.SGD)(theirs.parameters(), lr=0.5)
    theirs(x)["loss"].backward()
    unclipped = [p.grad.clone() for p in theirs.parameters()]
    if kind == "full_model":
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), value)
    wrapped.step()

    # largedet's loop: two micro-batches of 4 (K = 2), the plan's clip
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.5)
    loop = AccumulationTrainer(ours, iter([x[:4], x[4:]]), optimizer, 2, parameter_clip=plan.parameter_clip)
    with EventStorage(0):
        loop.run_planned_step(0, StepPlan(plan.accumulation_at(0), plan.clip_at(0)))
    # the loop's total norm is float32 (the logged grad_norm): its coefficient has float32's
    # precision, the per-parameter clips the gradients' own
    atol = 1e-7 if kind == "full_model" else 1e-12
    changed = False
    for p, q, g in zip(ours.parameters(), theirs.parameters(), unclipped):
        assert torch.allclose(p, q, rtol=0, atol=atol), kind
        changed |= not torch.allclose(p.grad, g)
    assert changed  # the bound was reached: something was clipped


def test_largedets_trainer_builds_the_optimizer_unwrapped_and_logs_the_clip(tiny_shapes, tmp_path):
    cfg = tiny_cfg(str(tmp_path), "SOLVER.CLIP_GRADIENTS.ENABLED", True, "SOLVER.MAX_ITER", 1)
    trainer = Trainer(cfg)
    assert type(trainer.optimizer) is torch.optim.SGD  # not Detectron2's clipping subclass
    assert trainer.loop.parameter_clip == trainer.plan.parameter_clip
    assert trainer.plan.describe_clipping() == (
        "gradient clipping: each element to [-1, 1] (SOLVER.CLIP_GRADIENTS)"
    )
    # a Detectron2 trainer (no accumulating loop) keeps Detectron2's wrapper
    plain = build_optimizer(cfg, nn.Linear(2, 2))
    assert isinstance(plain, torch.optim.SGD) and type(plain) is not torch.optim.SGD
