"""A LazyConfig's optimizer and LR schedule at the run plan's numbers: its ``optimizer``
and ``lr_multiplier`` (:mod:`largedet.engine.lazy` describes the parts), for
:class:`~largedet.engine.lazy.LazyParts`."""

from __future__ import annotations

import copy

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.solver import LRMultiplier
from omegaconf import DictConfig

from ..config.lazy import call_target, lr_schedule_within_run
from .build import log_param_groups, optimizer_param_groups
from .lr_scheduler import build_schedule
from .plan import RunPlan

__all__ = ["build_lazy_lr_scheduler", "build_lazy_optimizer"]


def build_lazy_optimizer(
    cfg: DictConfig, model: torch.nn.Module, run: CfgNode, plan: RunPlan
) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model`` at the peak LR of the run plan ``plan`` (of ``run``,
    :func:`~largedet.config.lazy.run_config`): ``optimizer.lr``, or the LSR's when
    ``train.lsr.enabled``. ``params.model`` is set to ``model``; with ``train.agvm.enabled``
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
