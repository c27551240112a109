from .classification import VideoClassificationEvaluator, last_classification_metric

__all__ = ["VideoClassificationEvaluator", "last_classification_metric"]
