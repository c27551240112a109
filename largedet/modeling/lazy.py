"""A LazyConfig's model (:mod:`largedet.engine.lazy` describes the parts)."""

from __future__ import annotations

import logging

import torch
from detectron2.config import instantiate
from omegaconf import DictConfig

from ..layers import resolve_sync_batchnorm

__all__ = ["build_lazy_model"]

logger = logging.getLogger(__name__)


def build_lazy_model(cfg: DictConfig, device: str) -> torch.nn.Module:
    """``cfg.model`` instantiated on ``device``, its "SyncBN" layers made runnable there."""
    model = instantiate(cfg.model)
    model.to(torch.device(device))
    model = resolve_sync_batchnorm(model, device)
    logger.info("Model:\n%s", model)
    return model
