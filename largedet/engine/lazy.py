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
  ``MultiStepParamScheduler``), *without* warm-up: the warm-up is ``train.warmup`` (in
  iterations), added as the yacs path adds ``SOLVER.WARMUP_*``;
- ``dataloader.train``: ``L(build_detection_train_loader)(dataset=
  L(get_detection_dataset_dicts)(names=...), mapper=..., num_workers=...,
  aspect_ratio_grouping=...)``, from which largedet builds its
  own resumable training loader with ``train.ims_per_device`` images per device;
  ``total_batch_size`` and ``sampler`` are not given (they are largedet's);
- ``dataloader.test`` (optional): the same form with ``build_detection_test_loader``; scored
  by ``dataloader.evaluator`` when given, else by the dataset's own evaluator (COCO,
  OpenImages) as in the yacs path;
- ``train``: the training loop's numbers, :data:`TRAIN_KEYS`, each the yacs key it names
  (``train.ims_per_batch`` is ``SOLVER.IMS_PER_BATCH``, the global batch, ...; units and
  scope in ``largedet/config/defaults.py``); :func:`train_defaults` gives them all with the yacs
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
from detectron2.solver import LRMultiplier, WarmupParamScheduler
from detectron2.solver.build import maybe_add_gradient_clipping
from detectron2.utils import comm
from omegaconf import DictConfig

from ..config.lazy import call_target, run_config, setup_lazy_config
from ..data.build import build_test_loader, build_train_loader
from ..layers import resolve_sync_batchnorm
from ..solver import log_param_groups, lr_scaling, optimizer_param_groups
from ..solver.batch import BatchPlan, batch_plan
from .launch import planned_world_size
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
    ``ValueError`` for a config that :func:`run_config` rejects and
    :class:`~largedet.solver.batch.BatchArithmeticError` for a global batch that does not split
    into whole micro-batches."""
    run = run_config(setup_lazy_config(args, log=False))
    return batch_plan(run, planned_world_size(args))


def build_lazy_model(cfg: DictConfig, device: str) -> torch.nn.Module:
    """``cfg.model`` instantiated on ``device``, its "SyncBN" layers made runnable there."""
    model = instantiate(cfg.model)
    model.to(torch.device(device))
    model = resolve_sync_batchnorm(model, device)
    logger.info("Model:\n%s", model)
    return model


def build_lazy_optimizer(
    cfg: DictConfig, model: torch.nn.Module, run: Optional[CfgNode] = None
) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model`` at the peak LR of ``run`` (:func:`run_config`):
    ``optimizer.lr``, or the LSR's when ``train.lsr.enabled``. ``params.model`` is set to
    ``model``; with ``train.agvm.enabled`` the param groups (which must come from
    :func:`~largedet.solver.optimizer_param_groups`) are split by the AGVM parts. Detectron2's
    gradient clipping (``train.clip_gradients``) wraps it when enabled. ``cfg`` is not
    modified."""
    run = run_config(cfg) if run is None else run
    root = copy.deepcopy(cfg)
    optimizer_cfg = root.optimizer
    optimizer_cfg.lr = lr_scaling(run).lr
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
    return maybe_add_gradient_clipping(run, optimizer)


def build_lazy_lr_scheduler(
    cfg: DictConfig, run: CfgNode, optimizer: torch.optim.Optimizer
) -> LRMultiplier:
    """``cfg.lr_multiplier`` after the warm-up of ``run`` (``train.warmup``), as one
    Detectron2 ``LRMultiplier`` over ``train.max_iter`` steps: the yacs path's
    ``WarmupParamScheduler`` around ``SOLVER.LR_SCHEDULER_NAME``'s schedule, with the
    lazy schedule in its place."""
    solver = run.SOLVER
    multiplier = WarmupParamScheduler(
        instantiate(cfg.lr_multiplier),
        solver.WARMUP_FACTOR,
        min(solver.WARMUP_ITERS / solver.MAX_ITER, 1.0),
        solver.WARMUP_METHOD,
        solver.RESCALE_INTERVAL,
    )
    return LRMultiplier(optimizer, multiplier=multiplier, max_iter=solver.MAX_ITER)


def lazy_test(cfg: DictConfig, model: torch.nn.Module) -> Dict[str, Any]:
    """Evaluate ``model`` on ``dataloader.test`` (``{}`` when the config has none), as
    :meth:`~largedet.engine.Trainer.test` does for one dataset: largedet's test loader of
    the dataset with the config's mapper, scored by ``dataloader.evaluator`` or, without
    one, by the evaluator the yacs path picks for the dataset."""
    if "test" not in cfg.dataloader:
        return {}
    run = run_config(cfg)
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
    LR schedule and loaders come from ``cfg``'s parts; the rest from :func:`run_config`::

        trainer = LazyTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()
    """

    def __init__(self, cfg: DictConfig):
        self.lazy = cfg
        super().__init__(run_config(cfg))

    def build_model(self, cfg: CfgNode) -> torch.nn.Module:
        return build_lazy_model(self.lazy, cfg.MODEL.DEVICE)

    def build_optimizer(self, cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:
        return build_lazy_optimizer(self.lazy, model, cfg)

    def build_lr_scheduler(self, cfg: CfgNode, optimizer: torch.optim.Optimizer):
        return build_lazy_lr_scheduler(self.lazy, cfg, optimizer)

    def build_train_loader(self, cfg: CfgNode):
        """largedet's resumable training loader (:func:`~largedet.data.build_train_loader`)
        with ``train.ims_per_device`` images per batch and ``dataloader.train.mapper``."""
        per_device = batch_plan(cfg, comm.get_world_size()).per_device
        return build_train_loader(
            cfg, per_device, mapper=instantiate(self.lazy.dataloader.train.mapper)
        )

    def test(self, cfg: CfgNode, model: torch.nn.Module, evaluators: Optional[List] = None):
        """:func:`lazy_test` (``evaluators`` are not supported: use ``dataloader.evaluator``)."""
        if evaluators is not None:
            raise ValueError("LazyTrainer.test takes its evaluator from dataloader.evaluator")
        return lazy_test(self.lazy, model)
