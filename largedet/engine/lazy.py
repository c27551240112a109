"""Training from a Detectron2 LazyConfig (a Python config file) with largedet's trainer.

A largedet LazyConfig has Detectron2's parts, ``model``, ``dataloader``, ``optimizer``,
``lr_multiplier`` and ``train``, and optionally ``datasets``:

- ``model``: any ``LazyCall`` that builds the model (moved to ``train.device``; "SyncBN"
  layers made runnable there, as in the yacs path);
- ``optimizer``: ``L(PMDLAMB)(params=L(optimizer_param_groups)(...), lr=..., ...)`` or any
  other optimizer; ``params.model`` is filled in. ``optimizer.lr`` plays
  ``SOLVER.BASE_LR``: with ``train.lsr.enabled`` it is replaced by the linear scaling
  rule's peak LR, and whatever interpolates it (``base_lr="${..lr}"``) follows;
- ``lr_multiplier``: an fvcore ``ParamScheduler`` over the whole run (e.g.
  ``MultiStepParamScheduler``), without warm-up: the warm-up is ``train.warmup`` (in
  iterations), added as the yacs path adds ``SOLVER.WARMUP_*``; or, as Detectron2's configs
  have it, ``L(WarmupParamScheduler)(scheduler=..., warmup_length=..., ...)``, whose warm-up
  is then the run's (``train.warmup`` absent);
- ``dataloader.train``: ``L(build_detection_train_loader)(dataset=
  L(get_detection_dataset_dicts)(names=...), mapper=..., num_workers=...,
  aspect_ratio_grouping=...)``, from which largedet builds its
  own resumable training loader with ``train.ims_per_device`` images per device;
  the sampler is largedet's; Detectron2's ``total_batch_size`` is the global batch
  (``train.ims_per_batch``);
- ``dataloader.test`` (optional): the same form with ``build_detection_test_loader``; scored
  by ``dataloader.evaluator`` when given, else by the dataset's own evaluator (COCO,
  OpenImages) as in the yacs path;
- ``train``: the training loop's numbers, :data:`largedet.config.lazy.TRAIN_KEYS`, each the yacs key it names
  (``train.ims_per_batch`` is ``SOLVER.IMS_PER_BATCH``, the global batch, ...; units and
  scope in ``largedet/config/defaults.py``); :func:`largedet.config.lazy.train_defaults` gives them all with the yacs
  defaults;
- ``datasets`` (optional): registrations, each a ``LazyCall`` instantiated once in every
  process before any loader is built (``L(register_shapes)(spec=L(ShapesSpec)(...))``).

:class:`LazyParts` instantiate them (:mod:`largedet.solver.lazy`, :mod:`largedet.evaluation.lazy`)
as the parts (:mod:`largedet.engine.parts`) of largedet's one :class:`~largedet.engine.Trainer`
(:func:`lazy_trainer`). Everything else (gradient accumulation, the LSR, the warm-up,
checkpoints and exact resume, hooks, the start-of-run log block) is the yacs path's, driven
by :func:`~largedet.config.lazy.run_config`: the yacs config of ``train`` and of the
loaders' numbers, computed at the edge and never written back into the LazyConfig.
"""

from __future__ import annotations

import argparse
import logging
from typing import List, Optional

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.utils import comm
from omegaconf import DictConfig, OmegaConf

from ..config.lazy import TRAIN_KEYS, run_config, setup_lazy_config
from ..config.errors import ErrorCollector, error_lines
from ..config.lazy_checks import call_argument_errors, with_train_names
from ..config.validate import TRAINING_RULES, check_values
from ..data.build import build_train_loader
from ..data.checks import check_datasets, check_image_files, check_num_classes
from ..evaluation.lazy import lazy_test
from ..evaluation.registry import check_evaluator_types
from ..launch.processes import planned_world_size
from ..modeling.lazy import build_lazy_model
from ..solver.batch import BatchPlan, batch_plan
from ..solver.lazy import build_lazy_lr_scheduler, build_lazy_optimizer
from ..solver.plan import RunPlan
from .hooks import check_hook_names
from .parts import TrainerParts
from .trainer import Trainer

__all__ = [
    "LAZY_RULES",
    "LazyParts",
    "check_lazy_args",
    "lazy_trainer",
]

logger = logging.getLogger(__name__)

#: the rules a LazyConfig's run config is checked against: every declared key's but
#: ``SOLVER.LR_SCHEDULER_NAME``'s (its schedule is ``lr_multiplier``)
LAZY_RULES = tuple(r for r in TRAINING_RULES if r.key != "SOLVER.LR_SCHEDULER_NAME")


def check_lazy_args(args: argparse.Namespace) -> BatchPlan:
    """The batch plan of the run ``args`` describe (torchrun's ``WORLD_SIZE``, or
    ``--num-gpus`` x ``--num-machines`` processes), before any worker is spawned: raises
    ``ValueError`` for a config that :func:`run_config` rejects or whose values break their
    keys' rules (:class:`~largedet.config.validate.ConfigError`, naming the yacs key), and
    :class:`~largedet.solver.batch.BatchArithmeticError` for a global batch that does not split
    into whole micro-batches. ``train.device`` is resolved on this machine, or taken as
    ``cpu`` where ``args.check_device`` is False (the job runs elsewhere: ``tools/submit.py``).

    The data are checked as ``tools/train_net.py`` checks them, with the same one-line
    :class:`~largedet.config.validate.ConfigError`: the datasets of ``dataloader.train`` (and
    of ``dataloader.test`` unless ``--eval-only``) registered, their annotation files and
    image folders present (:func:`~largedet.data.checks.check_datasets`), for training
    ``model.roi_heads.num_classes`` (where the model has it) against the categories of each
    COCO json (:func:`~largedet.data.checks.check_num_classes`), without
    ``dataloader.evaluator`` each test dataset's ``evaluator_type`` registered
    (:func:`~largedet.evaluation.check_evaluator_types`), ``train.hooks`` registered
    (:func:`~largedet.engine.hooks.check_hook_names`), and unless
    ``args.check_data`` is False a sample of the images' sizes
    (:func:`~largedet.data.checks.check_image_files`). Every error found is raised at once,
    one line each; the arguments of the optimizer's, the schedule's and the model's
    ``LazyCall`` are checked against what they call, with the closest name
    (:func:`~largedet.config.lazy_checks.call_argument_errors`)."""
    if not getattr(args, "check_device", True):
        args = argparse.Namespace(**{**vars(args), "opts": [*(args.opts or []), "train.device=cpu"]})
    cfg = setup_lazy_config(args, log=False)
    errors = ErrorCollector(catch=(ValueError,))  # every error at once, one line each
    try:
        run = run_config(cfg, errors)  # a bad train.<key> recorded, left at its default
    except ValueError as e:
        errors.add(e)
        errors.raise_if_any()
    for line in call_argument_errors(cfg):  # optimizer.perod: ... did you mean period?
        errors.add(line)
    try:
        check_values(run, LAZY_RULES)
    except ValueError as e:  # each line names the yacs key: train.<name> (KEY): ...
        for line in error_lines(e):
            errors.add(with_train_names(line, TRAIN_KEYS))
    values_ok = not errors
    eval_only = getattr(args, "eval_only", False)
    keys = ("DATASETS.TEST",) if eval_only else ("DATASETS.TRAIN", "DATASETS.TEST")
    with errors.check():
        check_datasets(run, keys)
        num_classes = OmegaConf.select(cfg, "model.roi_heads.num_classes", default=None)
        if not eval_only and isinstance(num_classes, int):
            check_num_classes(run.DATASETS.TRAIN, "model.roi_heads.num_classes", num_classes)
        if getattr(args, "check_data", True):
            check_image_files(run, keys)
    with errors.check():
        if "evaluator" not in cfg.dataloader:  # the test datasets' own evaluators
            check_evaluator_types(run)
    with errors.check():
        check_hook_names(run)
    if values_ok:
        with errors.check():
            plan = batch_plan(run, planned_world_size(args))
    errors.raise_if_any()
    return plan


class LazyParts(TrainerParts):
    """The parts of a run of the LazyConfig ``cfg`` (:mod:`largedet.engine.parts`): the
    model, optimizer, LR schedule and loaders come from its ``model``, ``optimizer``,
    ``lr_multiplier`` and ``dataloader``; the run plan is built from the run config
    (:func:`~largedet.config.lazy.run_config`) as a yacs config's. The trainer is
    :class:`~largedet.engine.Trainer` itself::

        trainer = Trainer(run_config(cfg), parts=LazyParts(cfg))
        results = train_or_evaluate(Trainer, run_config(cfg), args, parts=LazyParts(cfg))

    Each method takes the run config where :class:`~largedet.engine.parts.TrainerParts`
    takes the yacs config; ``cfg`` is not modified."""

    #: the declared rules but ``SOLVER.LR_SCHEDULER_NAME``'s: a LazyConfig's schedule is its
    #: ``lr_multiplier`` (whose class name the run config carries)
    value_rules = LAZY_RULES

    def __init__(self, cfg: DictConfig):
        super().__init__(Trainer)
        self.lazy = cfg

    def build_model(self, cfg: CfgNode) -> torch.nn.Module:
        return build_lazy_model(self.lazy, cfg.MODEL.DEVICE)

    def build_train_loader(self, cfg: CfgNode):
        """largedet's resumable training loader (:func:`~largedet.data.build_train_loader`)
        with ``train.ims_per_device`` images per batch and ``dataloader.train.mapper``."""
        per_device = batch_plan(cfg, comm.get_world_size()).per_device
        return build_train_loader(cfg, per_device, mapper=instantiate(self.lazy.dataloader.train.mapper))

    def build_optimizer(self, cfg: CfgNode, model: torch.nn.Module, plan: RunPlan) -> torch.optim.Optimizer:
        return build_lazy_optimizer(self.lazy, model, cfg, plan)

    def build_lr_scheduler(self, cfg: CfgNode, optimizer: torch.optim.Optimizer, plan: RunPlan, max_iter=None):
        """``lr_multiplier`` after ``train.warmup`` over ``train.max_iter`` steps of the full
        batch, followed in images with a batch ramp (``train.batch_ramp``, in the run plan
        the trainer passes): :func:`build_lazy_lr_scheduler`."""
        return build_lazy_lr_scheduler(self.lazy, cfg, optimizer, plan)

    def test(self, cfg: CfgNode, model: torch.nn.Module, evaluators: Optional[List] = None):
        """:func:`lazy_test` (``evaluators`` are not supported: use ``dataloader.evaluator``)."""
        if evaluators is not None:
            raise ValueError("LazyParts.test takes its evaluator from dataloader.evaluator")
        return lazy_test(self.lazy, model, cfg)


def lazy_trainer(cfg: DictConfig) -> Trainer:
    """The :class:`~largedet.engine.Trainer` of the LazyConfig ``cfg``: of its run config,
    with its parts (:class:`LazyParts`)."""
    return Trainer(run_config(cfg), parts=LazyParts(cfg))
