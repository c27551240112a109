"""The model's parts named by the config, checked before launch against Detectron2's model
registries: each name registered (by Detectron2, largedet, the video project or a module
given to ``--import``), else one :class:`~largedet.config.errors.ConfigError` line naming
the key and what is registered. Without it an unregistered name is a ``KeyError`` from
every worker once it builds the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Tuple

from detectron2.config import CfgNode
from detectron2.modeling import (
    ANCHOR_GENERATOR_REGISTRY,
    BACKBONE_REGISTRY,
    META_ARCH_REGISTRY,
    PROPOSAL_GENERATOR_REGISTRY,
    ROI_BOX_HEAD_REGISTRY,
    ROI_HEADS_REGISTRY,
    ROI_KEYPOINT_HEAD_REGISTRY,
    ROI_MASK_HEAD_REGISTRY,
    RPN_HEAD_REGISTRY,
    SEM_SEG_HEADS_REGISTRY,
)
from fvcore.common.registry import Registry

from ..config.errors import ConfigError
from ..config.validate import lookup_key

__all__ = ["MODEL_KEYS", "check_model_names"]


def _always(cfg: CfgNode) -> bool:
    return True


#: (key, its registry, when the model reads it): the keys of Detectron2's model builders
MODEL_KEYS: Tuple[Tuple[str, Registry, Callable[[CfgNode], bool]], ...] = (
    ("MODEL.META_ARCHITECTURE", META_ARCH_REGISTRY, _always),
    ("MODEL.BACKBONE.NAME", BACKBONE_REGISTRY, _always),
    # "PrecomputedProposals": no generator, Detectron2's builder returns None
    ("MODEL.PROPOSAL_GENERATOR.NAME", PROPOSAL_GENERATOR_REGISTRY,
     lambda cfg: cfg.MODEL.PROPOSAL_GENERATOR.NAME != "PrecomputedProposals"),
    ("MODEL.RPN.HEAD_NAME", RPN_HEAD_REGISTRY, lambda cfg: cfg.MODEL.PROPOSAL_GENERATOR.NAME == "RPN"),
    ("MODEL.ANCHOR_GENERATOR.NAME", ANCHOR_GENERATOR_REGISTRY, _always),
    ("MODEL.ROI_HEADS.NAME", ROI_HEADS_REGISTRY, _always),
    ("MODEL.ROI_BOX_HEAD.NAME", ROI_BOX_HEAD_REGISTRY, lambda cfg: bool(cfg.MODEL.ROI_BOX_HEAD.NAME)),
    ("MODEL.ROI_MASK_HEAD.NAME", ROI_MASK_HEAD_REGISTRY, lambda cfg: cfg.MODEL.MASK_ON),
    ("MODEL.ROI_KEYPOINT_HEAD.NAME", ROI_KEYPOINT_HEAD_REGISTRY, lambda cfg: cfg.MODEL.KEYPOINT_ON),
    ("MODEL.SEM_SEG_HEAD.NAME", SEM_SEG_HEADS_REGISTRY, _always),
)  # fmt: skip


def check_model_names(cfg: CfgNode) -> None:
    """Each key of :data:`MODEL_KEYS` that the model reads names an entry of its registry;
    raises :class:`~largedet.config.errors.ConfigError` naming the key and the registry's
    entries."""
    for key, registry, applies in MODEL_KEYS:
        if not applies(cfg):
            continue
        name = lookup_key(cfg, key)[1]
        if name not in registry:
            names = ", ".join(sorted(n for n, _ in registry))
            raise ConfigError(f"{key}: {name!r} is not registered; registered: {names}")
