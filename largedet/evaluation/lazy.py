"""The evaluation of a LazyConfig's model on its ``dataloader.test``
(:mod:`largedet.engine.lazy` describes the parts)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import torch
from detectron2.config import CfgNode, instantiate
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from omegaconf import DictConfig

from ..config.lazy import run_config
from ..data.build import build_test_loader
from .registry import build_evaluator

__all__ = ["lazy_test"]

logger = logging.getLogger(__name__)


def lazy_test(cfg: DictConfig, model: torch.nn.Module, run: Optional[CfgNode] = None) -> Dict[str, Any]:
    """Evaluate ``model`` on ``dataloader.test`` (``{}`` when the config has none), as
    ``largedet.engine.Trainer.test`` does for one dataset: largedet's test loader of
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
            evaluator = build_evaluator(run, name, os.path.join(run.OUTPUT_DIR, "inference"))
        results[name] = inference_on_dataset(model, loader, evaluator)
        if comm.is_main_process():
            logger.info("Evaluation results for %s in csv format:", name)
            print_csv_format(results[name])
    return results[name] if len(results) == 1 else results
