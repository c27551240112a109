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

:class:`LazyTrainer` is largedet's :class:`~largedet.engine.Trainer` whose ``build_*``
methods instantiate these parts. Everything else (gradient accumulation, the LSR, the
warm-up, checkpoints and exact resume, hooks, the start-of-run log block) is the yacs
path's, driven by :func:`~largedet.config.lazy.run_config`: the yacs config of ``train`` and of the loaders'
numbers, computed at the edge and never written back into the LazyConfig.
"""

from __future__ import annotations

import argparse
import copy
import logging
from typing import Any, Dict, List, Optional

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from omegaconf import DictConfig, OmegaConf

from ..config.lazy import TRAIN_KEYS, call_target, lr_schedule_within_run, run_config, setup_lazy_config
from ..config.errors import ErrorCollector, error_lines
from ..config.lazy_checks import call_argument_errors, with_train_names
from ..config.validate import check_values
from ..data.build import build_test_loader, build_train_loader
from ..data.checks import check_datasets, check_image_files, check_num_classes
from ..evaluation.registry import check_evaluator_types
from ..launch.processes import planned_world_size
from ..layers import resolve_sync_batchnorm
from ..solver import build_schedule, log_param_groups, optimizer_param_groups
from ..solver.batch import BatchPlan, batch_plan
from ..solver.plan import RunPlan
from .hooks import check_hook_names
from .trainer import Trainer

__all__ = [
    "LazyTrainer",
    "build_lazy_lr_scheduler",
    "build_lazy_model",
    "build_lazy_optimizer",
    "check_lazy_args",
    "lazy_test",
]

logger = logging.getLogger(__name__)


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
        check_values(run, LazyTrainer.value_rules())
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


def build_lazy_model(cfg: DictConfig, device: str) -> torch.nn.Module:
    """``cfg.model`` instantiated on ``device``, its "SyncBN" layers made runnable there."""
    model = instantiate(cfg.model)
    model.to(torch.device(device))
    model = resolve_sync_batchnorm(model, device)
    logger.info("Model:\n%s", model)
    return model


def build_lazy_optimizer(
    cfg: DictConfig, model: torch.nn.Module, run: CfgNode, plan: RunPlan
) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model`` at the peak LR of the run plan ``plan`` (of ``run``,
    :func:`run_config`): ``optimizer.lr``, or the LSR's when ``train.lsr.enabled``. ``params.model`` is set to ``model``; with ``train.agvm.enabled``
    the param groups (which must come from :func:`~largedet.solver.optimizer_param_groups`)
    are split by the AGVM parts. The gradients are clipped by the training loop
    (``train.clip_gradients`` is the run plan's). ``cfg`` is not modified."""
    root = copy.deepcopy(cfg)
    optimizer_cfg = root.optimizer
    optimizer_cfg.lr = plan.lr.lr
    params = optimizer_cfg.get("params")
    if isinstance(params, DictConfig) and "_target_" in params:
        params.model = model
    if run.SOLVER.AGVM.ENABLED:
        if not isinstance(params, DictConfig) or call_target(params) is not optimizer_param_groups:
            raise ValueError(
                "train.agvm.enabled needs optimizer.params = L(optimizer_param_groups)(...), "
                "whose groups it splits by model part"
            )
        params.parts = [list(pair) for pair in run.SOLVER.AGVM.GROUPS]
    optimizer = instantiate(optimizer_cfg)
    log_param_groups(run.SOLVER.OPTIMIZER, optimizer)
    return optimizer


def build_lazy_lr_scheduler(
    cfg: DictConfig,
    run: CfgNode,
    optimizer: torch.optim.Optimizer,
    plan: RunPlan,
) -> LRMultiplier:
    """``cfg.lr_multiplier``'s schedule (:func:`~largedet.config.lazy.lr_schedule_within_run`:
    milestones past ``train.max_iter`` dropped, as the yacs path drops ``SOLVER.STEPS``)
    through the yacs path's one builder (:func:`~largedet.solver.build_schedule`): after the
    run plan's warm-up (``train.warmup``, or a Detectron2 ``WarmupParamScheduler``'s, read
    into ``run``), as one Detectron2 ``LRMultiplier`` over ``train.max_iter`` steps; with a
    batch ramp (``train.batch_ramp``) followed in images, times the LSR rule's factor at each
    step's batch."""
    return build_schedule(run, optimizer, lr_schedule_within_run(cfg), plan)


def lazy_test(cfg: DictConfig, model: torch.nn.Module, run: Optional[CfgNode] = None) -> Dict[str, Any]:
    """Evaluate ``model`` on ``dataloader.test`` (``{}`` when the config has none), as
    :meth:`~largedet.engine.Trainer.test` does for one dataset: largedet's test loader of
    the dataset with the config's mapper, scored by ``dataloader.evaluator`` or, without
    one, by the evaluator the yacs path picks for the dataset."""
    if "test" not in cfg.dataloader:
        return {}
    run = run_config(cfg) if run is None else run
    results: Dict[str, Any] = {}
    for name in run.DATASETS.TEST:
        loader = build_test_loader(run, name, mapper=instantiate(cfg.dataloader.test.mapper))
        if "evaluator" in cfg.dataloader:
            evaluator = instantiate(cfg.dataloader.evaluator)
        else:
            evaluator = Trainer.build_evaluator(run, name)
        results[name] = inference_on_dataset(model, loader, evaluator)
        if comm.is_main_process():
            logger.info("Evaluation results for %s in csv format:", name)
            print_csv_format(results[name])
    return results[name] if len(results) == 1 else results


class LazyTrainer(Trainer):
    """largedet's :class:`~largedet.engine.Trainer` on a LazyConfig: the model, optimizer,
    LR schedule and loaders come from the LazyConfig's parts; the rest from its
    :func:`run_config`. Its builders keep ``DefaultTrainer``'s signatures (classmethods of
    the run's yacs config), so :func:`~largedet.engine.train_or_evaluate` serves it as it
    serves :class:`~largedet.engine.Trainer`: the class of one LazyConfig is
    ``LazyTrainer.for_config(cfg)``, whose builders read that config::

        trainer_cls = LazyTrainer.for_config(cfg)
        results = train_or_evaluate(trainer_cls, run_config(cfg), args)

    ``LazyTrainer(cfg)`` with a LazyConfig is ``LazyTrainer.for_config(cfg)(run_config(cfg))``.
    """

    #: the LazyConfig whose parts the builders instantiate (set by :meth:`for_config`)
    lazy: Optional[DictConfig] = None

    @classmethod
    def for_config(cls, cfg: DictConfig) -> type:
        """The trainer class of the LazyConfig ``cfg``: a subclass whose :attr:`lazy` it is."""
        return type(cls.__name__, (cls,), {"lazy": cfg, "__module__": cls.__module__})

    def __new__(cls, cfg, *args, **kwargs):
        if isinstance(cfg, DictConfig):  # LazyTrainer(lazy_cfg)
            cls = cls.for_config(cfg)
        return super().__new__(cls)

    def __init__(self, cfg):
        if isinstance(cfg, DictConfig):
            cfg = run_config(cfg)
        super().__init__(cfg)

    @classmethod
    def value_rules(cls) -> tuple:
        """The declared rules but ``SOLVER.LR_SCHEDULER_NAME``'s: a LazyConfig's schedule is
        its ``lr_multiplier`` (whose class name the run config carries)."""
        return tuple(r for r in super().value_rules() if r.key != "SOLVER.LR_SCHEDULER_NAME")

    @classmethod
    def _lazy(cls) -> DictConfig:
        if cls.lazy is None:
            raise TypeError(
                "LazyTrainer has no LazyConfig: use LazyTrainer.for_config(cfg) or LazyTrainer(cfg)"
            )
        return cls.lazy

    @classmethod
    def build_model(cls, cfg: CfgNode) -> torch.nn.Module:
        return build_lazy_model(cls._lazy(), cfg.MODEL.DEVICE)

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model: torch.nn.Module, plan: RunPlan) -> torch.optim.Optimizer:
        return build_lazy_optimizer(cls._lazy(), model, cfg, plan)

    @classmethod
    def build_lr_scheduler(
        cls, cfg: CfgNode, optimizer: torch.optim.Optimizer, plan: RunPlan, max_iter=None
    ):
        """``lr_multiplier`` after ``train.warmup`` over ``train.max_iter`` steps of the full
        batch, followed in images with a batch ramp (``train.batch_ramp``, in the run plan
        the trainer passes): :func:`build_lazy_lr_scheduler`."""
        return build_lazy_lr_scheduler(cls._lazy(), cfg, optimizer, plan)

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        """largedet's resumable training loader (:func:`~largedet.data.build_train_loader`)
        with ``train.ims_per_device`` images per batch and ``dataloader.train.mapper``."""
        per_device = batch_plan(cfg, comm.get_world_size()).per_device
        return build_train_loader(
            cfg, per_device, mapper=instantiate(cls._lazy().dataloader.train.mapper)
        )

    @classmethod
    def test(cls, cfg: CfgNode, model: torch.nn.Module, evaluators: Optional[List] = None):
        """:func:`lazy_test` (``evaluators`` are not supported: use ``dataloader.evaluator``)."""
        if evaluators is not None:
            raise ValueError("LazyTrainer.test takes its evaluator from dataloader.evaluator")
        return lazy_test(cls._lazy(), model, cfg)
