"""Top-k accuracy of video classification, over all ranks."""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from detectron2.evaluation import DatasetEvaluator
from detectron2.utils import comm

__all__ = ["VideoClassificationEvaluator", "last_classification_metric"]

logger = logging.getLogger(__name__)


class VideoClassificationEvaluator(DatasetEvaluator):
    """Top-1 and top-5 accuracy and mean class accuracy, in percent, from the
    view-averaged scores of :class:`~largedet_video.modeling.VideoClassifier`
    (top-5 only when there are more than 5 classes).

    Videos the loader could not read (``valid`` False) are left out of the
    accuracy and reported as a count.
    """

    def __init__(self, dataset_name: str, distributed: bool = True, topk: int = 5):
        self.dataset_name = dataset_name
        self.distributed = distributed
        self.topk = topk
        self.reset()

    def reset(self) -> None:
        self._labels: List[int] = []
        self._ranked: List[np.ndarray] = []
        self._skipped = 0

    def process(self, inputs: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor]) -> None:
        scores = outputs["scores"]
        k = self.topk if scores.shape[1] > self.topk else 1
        ranked = scores.topk(k, dim=1).indices.cpu().numpy()
        for label, valid, top in zip(inputs["label"].tolist(), inputs["valid"].tolist(), ranked):
            if valid:
                self._labels.append(label)
                self._ranked.append(top)
            else:
                self._skipped += 1

    def evaluate(self):
        labels, ranked, skipped = self._labels, self._ranked, self._skipped
        if self.distributed:
            comm.synchronize()
            parts = comm.gather((labels, ranked, skipped), dst=0)
            if not comm.is_main_process():
                return {}
            labels = list(itertools.chain.from_iterable(p[0] for p in parts))
            ranked = list(itertools.chain.from_iterable(p[1] for p in parts))
            skipped = sum(p[2] for p in parts)
        if skipped:
            logger.warning(
                "%s: %d unreadable videos left out of the evaluation", self.dataset_name, skipped
            )
        if not labels:
            logger.warning("%s: no video was evaluated", self.dataset_name)
            return {}
        labels_np = np.asarray(labels)
        ranked_np = np.stack(ranked)
        hit1 = ranked_np[:, 0] == labels_np
        hitk = (ranked_np == labels_np[:, None]).any(axis=1)
        per_class = [hit1[labels_np == c].mean() for c in np.unique(labels_np)]
        result = OrderedDict(top1=100.0 * float(hit1.mean()))
        if ranked_np.shape[1] == self.topk:
            result[f"top{self.topk}"] = 100.0 * float(hitk.mean())
        result["mean_class_acc"] = 100.0 * float(np.mean(per_class))
        result["num_videos"] = float(len(labels))
        result["num_skipped"] = float(skipped)
        return OrderedDict(classification=result)


def last_classification_metric(metrics: Sequence[dict], test_set: str, key: str = "top1") -> Optional[float]:
    """The last ``key`` (``top1``, ``top5``, ``mean_class_accuracy``, ``num_videos``, ...) of
    ``test_set`` in a run's ``metrics.json`` rows: ``<test_set>/classification/<key>``, or
    ``classification/<key>`` where the run has one test set; None where there is none."""
    value = None
    for m in metrics:
        for name in (f"{test_set}/classification/{key}", f"classification/{key}"):
            if name in m:
                value = float(m[name])
                break
    return value
