"""Loading ImageNet weights from a local file into the video backbones."""

from __future__ import annotations

import logging
import os
from typing import Dict

import torch
from torch import nn

__all__ = ["load_imagenet_weights", "inflate_conv_weight"]

logger = logging.getLogger(__name__)


def inflate_conv_weight(weight_2d: torch.Tensor, kernel_t: int) -> torch.Tensor:
    """I3D's inflation: ``(O, I, kh, kw)`` -> ``(O, I, kernel_t, kh, kw)``, the 2D
    kernel repeated over time and divided by ``kernel_t``, so that a clip of
    identical frames gives the 2D network's response."""
    return weight_2d.unsqueeze(2).repeat(1, 1, kernel_t, 1, 1) / kernel_t


def _unwrap(state: Dict) -> Dict[str, torch.Tensor]:
    for key in ("state_dict", "model"):
        if key in state and isinstance(state[key], dict):
            state = state[key]
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def load_imagenet_weights(backbone: nn.Module, path: str) -> None:
    """Load a torchvision-format ResNet state dict from ``path`` (``~`` expanded)
    into ``backbone``.

    Tensors are matched by name; 2D conv kernels are inflated where the backbone
    has 3D ones (:func:`inflate_conv_weight`). The classifier (``fc.*``) and any
    other unmatched entries are reported in the log. Nothing is downloaded.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: no tensor of the file matches the backbone (a wrong file).
    """
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"ImageNet weights not found at {path} (MODEL.VIDEO.PRETRAINED); point it to a "
            "local torchvision ResNet state dict, or set it to '' to start from scratch"
        )
    state = _unwrap(torch.load(path, map_location="cpu", weights_only=True))
    own = backbone.state_dict()
    loaded, inflated, skipped = {}, [], []
    for name, dst in own.items():
        src = state.get(name)
        if src is None:
            continue
        if src.shape == dst.shape:
            loaded[name] = src
        elif dst.dim() == 5 and src.dim() == 4 and dst.shape[:2] + dst.shape[3:] == src.shape:
            loaded[name] = inflate_conv_weight(src, dst.shape[2])
            inflated.append(name)
        else:
            skipped.append(f"{name}: file {tuple(src.shape)} vs model {tuple(dst.shape)}")
    if not loaded:
        raise ValueError(f"No tensor in {path} matches the backbone's parameter names")
    backbone.load_state_dict(loaded, strict=False)
    missing = sorted(set(own) - set(loaded))
    unused = sorted(set(state) - set(own))
    logger.info(
        "Loaded %d/%d backbone tensors from %s (%d inflated to 3D)",
        len(loaded),
        len(own),
        path,
        len(inflated),
    )
    if missing:
        logger.warning("Not in the file (left at their initialization): %s", missing)
    if unused:
        logger.info("In the file but not used: %s", unused)
    if skipped:
        logger.warning("Shape mismatch, not loaded: %s", skipped)
