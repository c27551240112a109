"""Detectron2's COCO evaluator on the images that were evaluated, not on every image
of the ground truth."""

from __future__ import annotations

import itertools

from detectron2.evaluation import COCOEvaluator as _DetectronCOCOEvaluator
from detectron2.utils import comm

__all__ = ["COCOEvaluator"]


class COCOEvaluator(_DetectronCOCOEvaluator):
    """Detectron2's ``COCOEvaluator`` scoring only the images that went through
    :meth:`process`, as :class:`~largedet.evaluation.OIDEvaluator` does.

    Detectron2's scores every image of the ground truth, so an image the test loader
    left out (unreadable: :func:`largedet.engine.data.build_test_loader`) would count as
    one with no detections. Here it is left out of the metric and counted in a warning.
    When every image is processed the numbers are Detectron2's.
    """

    def evaluate(self, img_ids=None):
        """As Detectron2's; ``img_ids`` None means the images processed on all ranks."""
        if img_ids is None:
            processed = [p["image_id"] for p in self._predictions]
            if self._distributed:
                processed = list(itertools.chain(*comm.gather(processed, dst=0)))
            img_ids = sorted(set(processed))
            left_out = len(set(self._coco_api.getImgIds()) - set(img_ids))
            if left_out and comm.is_main_process():
                self._logger.warning(
                    "%d of %d images were not processed (unreadable) and are left out of "
                    "the evaluation",
                    left_out,
                    len(self._coco_api.getImgIds()),
                )
        return super().evaluate(img_ids)
