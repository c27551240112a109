"""largedet's detection trainer: Detectron2's ``DefaultTrainer`` with largedet's builders."""

from __future__ import annotations

import logging
import os

from detectron2.data import MetadataCatalog
from detectron2.engine import DefaultTrainer
from detectron2.evaluation import COCOEvaluator, DatasetEvaluators

from .. import HAS_COMPILED_D2_OPS

logger = logging.getLogger(__name__)


class Trainer(DefaultTrainer):
    """Trains and evaluates a Detectron2 model with largedet's optimizers and datasets."""

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        """COCO evaluation (pycocotools where Detectron2's compiled evaluator is absent)."""
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference")
        evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type", "coco")
        if evaluator_type == "coco":
            return COCOEvaluator(
                dataset_name, output_dir=output_folder, use_fast_impl=HAS_COMPILED_D2_OPS
            )
        raise ValueError(f"No evaluator for dataset {dataset_name!r} (evaluator_type={evaluator_type!r})")

    def train(self):
        """Train, then return the last evaluation results (``{}`` when none ran)."""
        super().train()
        return getattr(self, "_last_eval_results", None) or {}
