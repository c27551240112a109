"""Detectron2's COCO evaluator on the images that were evaluated, not on every image
of the ground truth, scored by faster-coco-eval where it is installed."""

from __future__ import annotations

import itertools
import json
import logging
import os

from detectron2.evaluation import COCOEvaluator as _DetectronCOCOEvaluator
from detectron2.utils import comm
from detectron2.utils.file_io import PathManager
from detectron2.utils.logger import log_first_n

from .coco import coco_eval_impl

__all__ = ["COCOEvaluator"]


class COCOEvaluator(_DetectronCOCOEvaluator):
    """Detectron2's ``COCOEvaluator`` scoring only the images that went through
    :meth:`process`, as :class:`~largedet.evaluation.OIDEvaluator` does, with a choice of
    the implementation that computes the metrics.

    Detectron2's scores every image of the ground truth, so an image the test loader
    left out (unreadable: :func:`largedet.data.test_loader.build_test_loader`) would count as
    one with no detections. Here it is left out of the metric and counted in a warning.
    When every image is processed the numbers are Detectron2's.

    ``impl`` picks what computes box and mask AP (see :mod:`largedet.evaluation.coco`):

    - ``"auto"`` (the default): Detectron2's compiled ``COCOeval_opt`` where
      ``use_fast_impl`` asks for it and it is built (Detectron2's ``_C``), else
      faster-coco-eval where it is installed, else pycocotools' ``COCOeval``;
    - ``"faster"``: faster-coco-eval (``ImportError`` when it is not installed);
    - ``"pycocotools"``: pycocotools' ``COCOeval``, whatever ``use_fast_impl`` says.

    faster-coco-eval gives pycocotools' numbers; results have Detectron2's format either
    way (``AP``, ``AP50``, ..., ``AP-<class>`` in percent). Keypoints, which faster-coco-eval
    is not tested on here, always take Detectron2's path. Which implementation evaluates
    is logged once per process.
    """

    def __init__(self, dataset_name, tasks=None, distributed=True, output_dir=None, *, impl="auto", **kwargs):
        """As Detectron2's, with ``impl`` (above); ``kwargs`` go to Detectron2's."""
        super().__init__(dataset_name, tasks, distributed, output_dir, **kwargs)
        if impl == "auto" and self._use_fast_impl:
            self._impl = None  # Detectron2's COCOeval_opt, through Detectron2's code
            described = "Detectron2's compiled COCOeval_opt (unofficial numbers)"
        else:
            self._impl = coco_eval_impl(impl)
            self._use_fast_impl = False
            described = f"{self._impl}'s COCOeval" + (" (pycocotools' numbers)" if self._impl.name == "faster" else "")
        log_first_n(logging.INFO, f"COCO evaluation by {described}", key="message")
        self._faster_coco_api = None

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
        if self._do_evaluation and comm.is_main_process():
            self._warn_without_ground_truth(img_ids)
        return super().evaluate(img_ids)

    def _warn_without_ground_truth(self, img_ids) -> None:
        """One warning where the evaluated images hold no annotation to score against (none,
        or only crowd regions): pycocotools' -1 for every metric, which Detectron2 reports as
        NaN, not -100."""
        images = self._coco_api.getImgIds() if img_ids is None else img_ids
        annotations = self._coco_api.loadAnns(self._coco_api.getAnnIds(imgIds=images))
        if not any(not a.get("iscrowd", 0) for a in annotations):
            self._logger.warning(
                "%s: the ground truth has no annotation (other than crowd regions) on the %d "
                "evaluated images: AP is undefined, reported as NaN",
                self._metadata.name,
                len(images),
            )

    def _eval_predictions(self, predictions, img_ids=None):
        """Detectron2's, with box and mask AP computed by faster-coco-eval when it evaluates:
        the same results (category ids mapped back, ``coco_instances_results.json`` written,
        ``self._results[task]`` from Detectron2's ``_derive_coco_results``)."""
        coco_results = list(itertools.chain(*[x["instances"] for x in predictions]))
        tasks = self._tasks or self._tasks_from_predictions(coco_results)
        if self._impl is None or self._impl.name != "faster" or "keypoints" in tasks:
            super()._eval_predictions(predictions, img_ids=img_ids)
            return

        self._logger.info("Preparing results for COCO format ...")
        self._to_dataset_category_ids(coco_results)
        if self._output_dir:
            file_path = os.path.join(self._output_dir, "coco_instances_results.json")
            self._logger.info(f"Saving results to {file_path}")
            with PathManager.open(file_path, "w") as f:
                f.write(json.dumps(coco_results))
        if not self._do_evaluation:
            self._logger.info("Annotations are not available for evaluation.")
            return

        self._logger.info(f"Evaluating predictions with {self._impl} ...")
        for task in sorted(tasks):
            coco_eval = self._evaluate_task(coco_results, task, img_ids) if coco_results else None
            self._results[task] = self._derive_coco_results(
                coco_eval, task, class_names=self._metadata.get("thing_classes")
            )

    def _to_dataset_category_ids(self, coco_results):
        """Map the model's contiguous category ids back to the dataset's, in place, as
        Detectron2's ``_eval_predictions`` does."""
        if not hasattr(self._metadata, "thing_dataset_id_to_contiguous_id"):
            return
        reverse_id_mapping = {v: k for k, v in self._metadata.thing_dataset_id_to_contiguous_id.items()}
        for result in coco_results:
            category_id = result["category_id"]
            if category_id not in reverse_id_mapping:
                raise ValueError(
                    f"A prediction has class={category_id}, but the dataset only has "
                    f"{len(reverse_id_mapping)} classes and predicted class id should be in "
                    f"[0, {len(reverse_id_mapping) - 1}]."
                )
            result["category_id"] = reverse_id_mapping[category_id]

    def _evaluate_task(self, coco_results, iou_type, img_ids):
        """faster-coco-eval's ``COCOeval`` on ``coco_results`` for ``iou_type`` ("bbox" or
        "segm"), set up as Detectron2's ``_evaluate_predictions_on_coco`` sets pycocotools'
        (its ``maxDets``, the evaluated ``img_ids``); returns it summarized."""
        if self._faster_coco_api is None:
            # An index over the same dicts as pycocotools' (no copy); evaluating adds keys
            # to them ("ignore", and "rle" for masks), as pycocotools' COCOeval adds "ignore".
            self._faster_coco_api = self._impl.coco(self._coco_api.dataset)
        if iou_type == "segm":
            # As Detectron2: without "bbox" the mask's area, not the box's, decides
            # small/medium/large. Copies, so the results keep their boxes.
            coco_results = [{k: v for k, v in r.items() if k != "bbox"} for r in coco_results]
        coco_dt = self._faster_coco_api.loadRes(coco_results)
        coco_eval = self._impl.cocoeval(self._faster_coco_api, coco_dt, iou_type)
        # AP at the largest maxDets (100 unless max_dets_per_image says otherwise), as
        # Detectron2's COCOevalMaxDets; both sort maxDets first.
        coco_eval.params.maxDets = self._max_dets_per_image
        if img_ids is not None:
            coco_eval.params.imgIds = img_ids
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
        return coco_eval
