"""Evaluation: COCO results files (pycocotools); the Open Images Challenge metric."""

from .coco import CocoEvalResult, CocoInputError, evaluate_coco_results

__all__ = ["CocoEvalResult", "CocoInputError", "evaluate_coco_results"]
