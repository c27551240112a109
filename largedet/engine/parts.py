"""What a trainer builds its run from: the model, the training loader, the run plan, the
optimizer, the LR schedule and the evaluation, as one object handed to
:class:`~largedet.engine.Trainer`.

One trainer class trains every config form; what differs between forms is its parts:
:class:`TrainerParts` for a yacs config (the trainer class's own ``build_*`` classmethods,
so a ``Trainer`` subclass that overrides ``build_model``, as with Detectron2's
``DefaultTrainer``, is served by them), :class:`~largedet.engine.lazy.LazyParts` for a
LazyConfig (its ``model``, ``optimizer``, ``lr_multiplier`` and ``dataloader``). Each form's
parts build the same :class:`~largedet.solver.plan.RunPlan`.
"""

from __future__ import annotations

from typing import Optional

from detectron2.utils import comm

from ..config.validate import TRAINING_RULES
from ..data.build import ResumableLoader
from ..solver.plan import RunPlan, run_plan

__all__ = ["TrainerParts"]


class TrainerParts:
    """The parts of a run of a yacs config: the builders of ``trainer_cls``
    (:class:`~largedet.engine.Trainer` or a subclass), called with Detectron2's parameters.

    ``value_rules``: the rules the trainer's config is checked against when it is built
    (every declared key's, :data:`~largedet.config.validate.TRAINING_RULES`)."""

    value_rules: tuple = TRAINING_RULES

    def __init__(self, trainer_cls):
        self.trainer_cls = trainer_cls

    def build_model(self, cfg):
        return self.trainer_cls.build_model(cfg)

    def build_train_loader(self, cfg):
        return self.trainer_cls.build_train_loader(cfg)

    def build_run_plan(self, cfg, data_loader) -> RunPlan:
        """The run plan (:func:`~largedet.solver.plan.run_plan`) on this job's processes, for
        the training loader's dataset (whose size a batch ramp's epochs need). Its
        :attr:`~largedet.solver.plan.RunPlan.run_length` is where the training loop stops;
        a run of its own length (the video project's multigrid plan) returns a plan of that
        length (:func:`~largedet.solver.plan.with_run_length`)."""
        size = data_loader.dataset_size if isinstance(data_loader, ResumableLoader) else None
        return run_plan(cfg, comm.get_world_size(), size)

    def build_optimizer(self, cfg, model, plan: RunPlan):
        return self.trainer_cls.build_optimizer(cfg, model, plan)

    def build_lr_scheduler(self, cfg, optimizer, plan: RunPlan, max_iter: Optional[int] = None):
        return self.trainer_cls.build_lr_scheduler(cfg, optimizer, plan, max_iter)

    def test(self, cfg, model, evaluators=None):
        return self.trainer_cls.test(cfg, model, evaluators)
