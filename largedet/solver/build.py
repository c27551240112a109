"""Optimizers from a Detectron2 config: :func:`build_optimizer` and its registry.

``SOLVER.OPTIMIZER`` names a builder in :data:`OPTIMIZER_REGISTRY`; the built-in ones
are the table :data:`BUILT_IN_OPTIMIZERS` ("SGD", "AdamW", "LAMB", "PMD_LAMB" and "LARS"),
which :func:`register_built_in_optimizers` enters, called once at the end of this module.
A builder is a function ``builder(cfg, model) -> torch.optim.Optimizer`` registered under
its ``__name__`` (fvcore's ``Registry``). A user adds one without editing largedet::

    from largedet.solver import OPTIMIZER_REGISTRY, get_optimizer_params

    @OPTIMIZER_REGISTRY.register()
    def RAdam(cfg, model):
        return torch.optim.RAdam(get_optimizer_params(cfg, model), lr=cfg.SOLVER.BASE_LR)

and sets ``SOLVER.OPTIMIZER: "RAdam"``. Under largedet's trainer the gradients are clipped
by the training loop (``SOLVER.CLIP_GRADIENTS`` too, :mod:`largedet.solver.plan`); for a
Detectron2 trainer :func:`build_optimizer` adds Detectron2's clipping wrapper.

With ``SOLVER.AGVM.ENABLED`` the parameter groups of :func:`get_optimizer_params` are
also split by model part (:func:`model_parts`, ``SOLVER.AGVM.GROUPS``), each group naming
its part under ``largedet.optim.PART_KEY``, and :func:`build_agvm` builds the
:class:`~largedet.optim.AGVM` that modulates each part's LR.

:func:`optimizer_param_groups` builds the same groups from explicit arguments, for
LazyConfig files (``L(PMDLAMB)(params=L(optimizer_param_groups)(...))``);
:func:`get_optimizer_params` is it with the arguments of ``cfg.SOLVER``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.config import CfgNode
from detectron2.utils import comm
from detectron2.solver.build import (
    get_default_optimizer_params,
    maybe_add_gradient_clipping,
    reduce_param_groups,
)
from fvcore.common.registry import Registry

from .. import optim
from ..config.errors import ConfigError
from .plan import agvm_start_iter

__all__ = [
    "BUILT_IN_OPTIMIZERS",
    "OPTIMIZER_REGISTRY",
    "NORM_MODULE_TYPES",
    "build_agvm",
    "build_optimizer",
    "check_optimizer_name",
    "describe_agvm_parts",
    "get_optimizer_params",
    "log_param_groups",
    "model_parts",
    "optimizer_param_groups",
    "register_built_in_optimizers",
]

logger = logging.getLogger(__name__)

OPTIMIZER_REGISTRY = Registry("OPTIMIZER")
OPTIMIZER_REGISTRY.__doc__ = """
Registry of optimizer builders, keyed by the values of ``SOLVER.OPTIMIZER``.
A builder is called as ``builder(cfg, model)`` and returns a ``torch.optim.Optimizer``.
"""

#: The module types whose parameters Detectron2's ``get_default_optimizer_params`` gives
#: ``SOLVER.WEIGHT_DECAY_NORM``; ``SOLVER.ADAPT_NORM`` applies to the same parameters.
NORM_MODULE_TYPES = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,  # also Detectron2's NaiveSyncBatchNorm
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
    torch.nn.GroupNorm,
    torch.nn.InstanceNorm1d,
    torch.nn.InstanceNorm2d,
    torch.nn.InstanceNorm3d,
    torch.nn.LayerNorm,
    torch.nn.LocalResponseNorm,
)


def model_parts(
    model: torch.nn.Module, groups: Sequence[Tuple[str, str]]
) -> Dict[torch.nn.Parameter, str]:
    """Each trainable parameter of ``model`` -> the name of its part.

    ``groups`` are ``(part name, module-name prefix)`` pairs (``SOLVER.AGVM.GROUPS``); a
    parameter belongs to the part of the longest prefix its name starts with (DDP's
    ``module.`` removed), so ``backbone.bottom_up`` wins over ``backbone``. Raises
    ``ValueError`` listing the parameters no prefix matches.
    """
    pairs = [(str(name), str(prefix)) for name, prefix in groups]
    if not pairs or any(not name or not prefix for name, prefix in pairs):
        raise ValueError(
            f"SOLVER.AGVM.GROUPS must be non-empty (part name, module-name prefix) pairs, got {groups}"
        )
    by_length = sorted(pairs, key=lambda pair: -len(pair[1]))
    parts, unmatched = {}, []
    for name, p in model.named_parameters():
        if not p.requires_grad or p in parts:
            continue
        name = name[len("module.") :] if name.startswith("module.") else name
        part = next((part for part, prefix in by_length if name.startswith(prefix)), None)
        if part is None:
            unmatched.append(name)
        else:
            parts[p] = part
    if unmatched:
        shown = ", ".join(unmatched[:8]) + (
            f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else ""
        )
        raise ValueError(
            f"SOLVER.AGVM.GROUPS {pairs} assign no part to the parameters {shown}: add a "
            "(part name, prefix) pair that covers them"
        )
    return parts


def optimizer_param_groups(
    model: torch.nn.Module,
    *,
    base_lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    weight_decay_norm: Optional[float] = None,
    weight_decay_bias: Optional[float] = None,
    bias_lr_factor: float = 1.0,
    layer_adaptive: bool = False,
    adapt_norm: bool = False,
    adapt_bias: bool = False,
    parts: Optional[Sequence[Tuple[str, str]]] = None,
) -> List[Dict[str, Any]]:
    """Parameter groups of ``model``'s trainable parameters, as few as possible, from
    explicit arguments (for a LazyConfig: ``L(PMDLAMB)(params=L(optimizer_param_groups)(...))``).

    Detectron2's ``get_default_optimizer_params`` sets each parameter's ``lr``
    (``base_lr``, times ``bias_lr_factor`` for biases) and ``weight_decay``
    (``weight_decay``; ``weight_decay_norm`` for normalization layers,
    ``weight_decay_bias`` for biases); a value left None is not set, so the optimizer's
    default applies. With ``layer_adaptive`` (LAMB, PMD-LAMB, LARS) every group also
    carries ``adapt``: ``adapt_norm`` for normalization-layer parameters
    (:data:`NORM_MODULE_TYPES`), ``adapt_bias`` for biases (which wins for a
    normalization layer's bias, as the bias weight decay does in Detectron2), True
    otherwise. With ``parts`` (``(part name, module-name prefix)`` pairs, see
    :func:`model_parts`) every group also carries its model part's name under
    ``largedet.optim.PART_KEY``, so each part owns its own groups (AGVM). Groups with
    equal hyperparameters (and part) are merged by Detectron2's ``reduce_param_groups``.
    """
    params = get_default_optimizer_params(
        model,
        base_lr=base_lr,
        weight_decay=weight_decay,
        weight_decay_norm=weight_decay_norm,
        bias_lr_factor=bias_lr_factor,
        weight_decay_bias=weight_decay_bias,
    )
    if parts is not None:
        by_part: Dict[str, List[torch.nn.Parameter]] = {}
        for p, part in model_parts(model, parts).items():
            by_part.setdefault(part, []).append(p)
        params = reduce_param_groups(
            params + [{"params": ps, optim.PART_KEY: part} for part, ps in by_part.items()]
        )
    if not layer_adaptive:
        return params
    everything, norm, bias = [], [], []
    seen = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or p in seen:
                continue
            seen.add(p)
            everything.append(p)
            if isinstance(module, NORM_MODULE_TYPES):
                norm.append(p)
            if name == "bias":
                bias.append(p)
    # later entries override earlier ones for the same parameter
    return reduce_param_groups(
        params
        + [
            {"params": everything, "adapt": True},
            {"params": norm, "adapt": adapt_norm},
            {"params": bias, "adapt": adapt_bias},
        ]
    )


def get_optimizer_params(
    cfg: CfgNode, model: torch.nn.Module, *, layer_adaptive: bool = False
) -> List[Dict[str, Any]]:
    """:func:`optimizer_param_groups` with the arguments of ``cfg.SOLVER``: ``BASE_LR``,
    ``WEIGHT_DECAY``, ``WEIGHT_DECAY_NORM``, ``WEIGHT_DECAY_BIAS``, ``BIAS_LR_FACTOR``,
    ``ADAPT_NORM`` and ``ADAPT_BIAS`` (with ``layer_adaptive``: LAMB, PMD-LAMB, LARS), and
    the parts of ``AGVM.GROUPS`` when ``AGVM.ENABLED``."""
    solver = cfg.SOLVER
    return optimizer_param_groups(
        model,
        base_lr=solver.BASE_LR,
        weight_decay=solver.WEIGHT_DECAY,
        weight_decay_norm=solver.WEIGHT_DECAY_NORM,
        weight_decay_bias=solver.WEIGHT_DECAY_BIAS,
        bias_lr_factor=solver.BIAS_LR_FACTOR,
        layer_adaptive=layer_adaptive,
        adapt_norm=solver.ADAPT_NORM,
        adapt_bias=solver.ADAPT_BIAS,
        parts=solver.AGVM.GROUPS if solver.AGVM.ENABLED else None,
    )


def log_param_groups(name: str, optimizer: torch.optim.Optimizer) -> None:
    """Log each param group of ``optimizer`` (built as ``name``): its tensor count, its
    ``lr``, ``weight_decay``, the keys the optimizer declares (``adapt``:
    :func:`~largedet.optim.group_keys`) and AGVM part, and for an optimizer with a compiled
    step how many of its tensors that step updates (:func:`~largedet.optim.compiled_tensors`)."""
    keys = ("lr", "weight_decay", *optim.group_keys(optimizer), optim.PART_KEY)
    for i, group in enumerate(optimizer.param_groups):
        hyper = {k: v for k, v in group.items() if k in keys}
        params = group["params"]
        compiled = optim.compiled_tensors(optimizer, group)
        path = "" if compiled is None else f"; compiled step for {compiled} of them"
        logger.info("%s param group %d: %d tensors, %s%s", name, i, len(params), hyper, path)


def build_optimizer(
    cfg: CfgNode, model: torch.nn.Module, *, accumulates: bool = False
) -> torch.optim.Optimizer:
    """The optimizer named by ``cfg.SOLVER.OPTIMIZER``.

    ``accumulates``: the caller's trainer is largedet's training loop
    (:class:`~largedet.engine.Trainer` passes True), which splits each step into
    ``SOLVER.IMS_PER_DEVICE`` micro-batches and clips the gradients as the run plan says
    (``SOLVER.CLIP_GRADIENTS`` among them): the optimizer is returned as built. Otherwise (a
    Detectron2 trainer) Detectron2's gradient clipping wraps it when
    ``SOLVER.CLIP_GRADIENTS.ENABLED``, and where ``SOLVER.IMS_PER_DEVICE`` asks for a
    per-device batch other than ``IMS_PER_BATCH / world size`` (what a Detectron2
    ``DefaultTrainer`` loads per step), one warning says that the key is not applied."""
    if not accumulates:
        _warn_unapplied_ims_per_device(cfg)
    name = cfg.SOLVER.OPTIMIZER
    optimizer = OPTIMIZER_REGISTRY.get(name)(cfg, model)
    log_param_groups(name, optimizer)
    return optimizer if accumulates else maybe_add_gradient_clipping(cfg, optimizer)


def _warn_unapplied_ims_per_device(cfg: CfgNode) -> None:
    total, per_device = cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.IMS_PER_DEVICE
    world = comm.get_world_size()
    if per_device and per_device * world != total:
        logger.warning(
            "SOLVER.IMS_PER_DEVICE %d is not applied by this trainer: a Detectron2 trainer loads "
            "IMS_PER_BATCH / world size = %d / %d images per device per step; largedet.engine."
            "Trainer (or its build_train_loader and AccumulationTrainer) accumulates %d-image "
            "micro-batches, or set SOLVER.IMS_PER_DEVICE 0",
            per_device,
            total,
            world,
            per_device,
        )


def check_optimizer_name(cfg: CfgNode) -> None:
    """Raise :class:`~largedet.config.errors.ConfigError` when ``SOLVER.OPTIMIZER`` names no
    builder of :data:`OPTIMIZER_REGISTRY` (the check before launch)."""
    names = sorted(n for n, _ in OPTIMIZER_REGISTRY)
    if cfg.SOLVER.OPTIMIZER not in names:
        raise ConfigError(
            f"SOLVER.OPTIMIZER: {cfg.SOLVER.OPTIMIZER!r} is not registered; registered: {', '.join(names)}"
        )


def build_agvm(cfg: CfgNode, optimizer: torch.optim.Optimizer) -> Optional[optim.AGVM]:
    """The :class:`~largedet.optim.AGVM` of ``cfg.SOLVER.AGVM`` for ``optimizer`` (whose
    groups :func:`get_optimizer_params` named by part), or None when AGVM is disabled."""
    agvm = cfg.SOLVER.AGVM
    if not agvm.ENABLED:
        return None
    return optim.AGVM(  # the values: their declared rules, checked before
        optimizer,
        reference=agvm.REFERENCE,
        period=agvm.PERIOD,
        start_iter=agvm_start_iter(cfg),
        clamp=tuple(agvm.CLAMP),
        momentum=agvm.MOMENTUM,
    )


# Builders. Their names are the SOLVER.OPTIMIZER values.


def SGD(cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:  # noqa: N802
    """``torch.optim.SGD``: ``SOLVER.MOMENTUM``, ``SOLVER.NESTEROV``, L2 weight decay."""
    return torch.optim.SGD(
        get_optimizer_params(cfg, model),
        lr=cfg.SOLVER.BASE_LR,
        momentum=cfg.SOLVER.MOMENTUM,
        nesterov=cfg.SOLVER.NESTEROV,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        foreach=cfg.SOLVER.FOREACH,
    )


def AdamW(cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:  # noqa: N802
    """``torch.optim.AdamW`` with torch's betas (0.9, 0.999) and eps 1e-8."""
    return torch.optim.AdamW(
        get_optimizer_params(cfg, model),
        lr=cfg.SOLVER.BASE_LR,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        foreach=cfg.SOLVER.FOREACH,
    )


def _lamb_args(cfg: CfgNode) -> Dict[str, Any]:
    return dict(
        lr=cfg.SOLVER.BASE_LR,
        betas=tuple(cfg.SOLVER.LAMB.BETAS),
        eps=cfg.SOLVER.LAMB.EPS,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        max_trust_ratio=cfg.SOLVER.LAMB.MAX_TRUST_RATIO,
        foreach=cfg.SOLVER.FOREACH,
        fused=optim.COMPILED_STEP_MODES[cfg.SOLVER.COMPILED_STEP],
    )


def LAMB(cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:  # noqa: N802
    """:class:`largedet.optim.LAMB` with ``SOLVER.LAMB.*``."""
    return optim.LAMB(get_optimizer_params(cfg, model, layer_adaptive=True), **_lamb_args(cfg))


def PMD_LAMB(cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:  # noqa: N802
    """:class:`largedet.optim.PMDLAMB` with ``SOLVER.LAMB.*`` and ``SOLVER.PMD.*``."""
    return optim.PMDLAMB(
        get_optimizer_params(cfg, model, layer_adaptive=True),
        period=cfg.SOLVER.PMD.PERIOD,
        decay=cfg.SOLVER.PMD.DECAY,
        **_lamb_args(cfg),
    )


def LARS(cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:  # noqa: N802
    """:class:`largedet.optim.LARS` with ``SOLVER.MOMENTUM`` and ``SOLVER.LARS.ETA``."""
    return optim.LARS(
        get_optimizer_params(cfg, model, layer_adaptive=True),
        lr=cfg.SOLVER.BASE_LR,
        momentum=cfg.SOLVER.MOMENTUM,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        eta=cfg.SOLVER.LARS.ETA,
        foreach=cfg.SOLVER.FOREACH,
        fused=optim.COMPILED_STEP_MODES[cfg.SOLVER.COMPILED_STEP],
    )


#: The built-in builders by their ``SOLVER.OPTIMIZER`` names (each its function's name).
BUILT_IN_OPTIMIZERS: Dict[str, Callable[[CfgNode, torch.nn.Module], torch.optim.Optimizer]] = {
    "SGD": SGD,
    "AdamW": AdamW,
    "LAMB": LAMB,
    "PMD_LAMB": PMD_LAMB,
    "LARS": LARS,
}


def register_built_in_optimizers(registry: Registry = OPTIMIZER_REGISTRY) -> None:
    """Enter :data:`BUILT_IN_OPTIMIZERS` into ``registry`` (those it does not hold yet)."""
    for name, builder in BUILT_IN_OPTIMIZERS.items():
        if name not in registry:
            registry.register(builder)


def describe_agvm_parts(optimizer: torch.optim.Optimizer, agvm: Optional[optim.AGVM]) -> Optional[str]:
    """AGVM's parts with their parameter groups and tensors in ``optimizer``, for the
    start-of-run block (None without AGVM)."""
    if agvm is None:
        return None
    counts = {name: [0, 0] for name in agvm.parts}  # param groups, tensors
    for group in optimizer.param_groups:
        counts[group[optim.PART_KEY]][0] += 1
        counts[group[optim.PART_KEY]][1] += len(group["params"])
    return ", ".join(f"{n} ({g} param groups, {t} tensors)" for n, (g, t) in counts.items())


register_built_in_optimizers()
