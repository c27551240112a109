from .classification import VideoClassificationEvaluator

__all__ = ["VideoClassificationEvaluator"]
