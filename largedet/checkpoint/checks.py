"""The checks of what a run writes and loads before any worker starts, each error one line
naming the key (a :class:`~largedet.config.errors.ConfigError`); the entry points call them
(:func:`largedet.engine.defaults.check_files`)."""

from __future__ import annotations

import os

from detectron2.config import CfgNode

from ..config.errors import ConfigError
from .atomic import UnsafeWeightsError, check_output_dir, check_torch_weights, load_model_zoo_pickle

__all__ = ["check_output_and_weights"]


def check_output_and_weights(cfg: CfgNode, training: bool, resume: bool = False) -> None:
    """For training, ``OUTPUT_DIR`` can be created and written; a local ``MODEL.WEIGHTS``
    file exists (not needed where ``resume`` and ``OUTPUT_DIR`` has a last checkpoint, which
    is loaded instead; URLs and ``detectron2://`` names are fetched by the workers) and, a
    ``.pkl``, holds only what a model-zoo file holds (read without running code), a ``.pth``
    loads with ``weights_only`` (:func:`~largedet.checkpoint.atomic.check_torch_weights`). Raises
    :class:`~largedet.config.errors.ConfigError`."""
    if training:
        try:
            check_output_dir(cfg.OUTPUT_DIR)
        except OSError as e:
            raise ConfigError(str(e)) from None
    weights = cfg.MODEL.WEIGHTS
    resumes = resume and os.path.isfile(os.path.join(cfg.OUTPUT_DIR, "last_checkpoint"))
    if weights and "://" not in weights and not resumes and not os.path.isfile(weights):
        what = "is a folder, not a file" if os.path.isdir(weights) else "not found"
        raise ConfigError(f"MODEL.WEIGHTS: {weights}: {what}")
    if os.path.isfile(weights):
        try:
            load_model_zoo_pickle(weights) if weights.endswith(".pkl") else check_torch_weights(weights)
        except UnsafeWeightsError as e:
            raise ConfigError(f"MODEL.WEIGHTS: {e}") from None
