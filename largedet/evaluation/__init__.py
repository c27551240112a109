"""Evaluation: COCO results files (pycocotools); the Open Images Challenge metric; the
registry of evaluators by a dataset's ``evaluator_type`` (:mod:`.registry`).

The Open Images names and the registry's are imported on first access: they need Detectron2
(through :mod:`largedet.data`), and :mod:`largedet.evaluation.coco`, with
``tools/coco_eval.py``, runs on pycocotools alone.
"""

import importlib

from .coco import CocoEvalResult, CocoInputError, evaluate_coco_results

# Exported name -> the submodule that defines it.
_OPENIMAGES_EXPORTS = {
    "OIDDetections": "oid_evaluation",
    "OIDGroundTruth": "oid_evaluation",
    "OIDResult": "oid_evaluation",
    "average_precision": "oid_evaluation",
    "evaluate_detections": "oid_evaluation",
    "evaluate_files": "oid_files",
    "expand_detections": "oid_evaluation",
    "expand_ground_truth": "oid_evaluation",
    "read_detections_csv": "oid_files",
    "OIDEvaluator": "oid_evaluator",
    "DEFAULT_EVALUATOR_TYPE": "registry",
    "EVALUATOR_REGISTRY": "registry",
    "build_evaluator": "registry",
    "check_evaluator_types": "registry",
}

__all__ = ["CocoEvalResult", "CocoInputError", "evaluate_coco_results", *_OPENIMAGES_EXPORTS]


def __getattr__(name: str):
    if name not in _OPENIMAGES_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_OPENIMAGES_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
