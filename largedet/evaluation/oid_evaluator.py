"""Detectron2 evaluator for OpenImages datasets: the Open Images Challenge metric."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Optional

import numpy as np

from detectron2.config import configurable
from detectron2.data import MetadataCatalog
from detectron2.evaluation import DatasetEvaluator
from detectron2.utils import comm
from detectron2.utils.file_io import PathManager

from largedet.data.openimages import load_openimages_ground_truth

from .oid_evaluation import OIDDetections, OIDGroundTruth, evaluate_detections, expand_detections
from .oid_files import write_detections_csv, write_per_class_csv

logger = logging.getLogger(__name__)

__all__ = ["OIDEvaluator"]


class OIDEvaluator(DatasetEvaluator):
    """Open Images Challenge mAP@0.5 (:mod:`largedet.evaluation.oid_evaluation`) of a
    dataset registered by :func:`largedet.data.openimages.register_openimages`.

    The ground truth comes from the dataset's files (metadata ``boxes_csv``,
    ``class_descriptions_csv``, ``image_labels_csv``, ``hierarchy_json``,
    ``class_subset_csv``, read by
    :func:`~largedet.data.openimages.load_openimages_ground_truth` through the parse
    cache, as the dataset reads them); the evaluated classes are the dataset's
    contiguous classes. As Detectron2's COCO evaluator does, only the
    images that went through :meth:`process` are evaluated. Predictions are gathered
    to the main process with ``detectron2.utils.comm``.

    Results: ``{"bbox": {"AP50": mAP, "AP50-<DisplayName>": AP, ...}}`` in percent
    (Detectron2's convention); classes without ground truth are left out. With an
    ``output_dir``, the detections (``oid_detections.csv``, the format of
    ``tools/oid_eval.py --detections``) and the per-class APs
    (``oid_per_class_ap.csv``) are written there.
    """

    @configurable
    def __init__(
        self,
        dataset_name: str,
        *,
        distributed: bool = True,
        output_dir: Optional[str] = None,
        expand_detections: bool = False,
    ):
        """
        Args:
            dataset_name: a registered OpenImages dataset.
            distributed: gather predictions from all ranks; evaluate on the main one.
            output_dir: where to write the detections and the per-class APs.
            expand_detections: before scoring, copy each detection to every ancestor
                class (with the hierarchy of the dataset). Not part of the metric: the
                post-processing for a detector trained on leaf labels only.
        """
        meta = MetadataCatalog.get(dataset_name)
        if getattr(meta, "evaluator_type", None) != "openimages":
            raise ValueError(
                f"{dataset_name!r} is not an OpenImages dataset (register it with register_openimages)"
            )
        if expand_detections and not meta.hierarchy_json:
            raise ValueError(
                f"expand_detections needs a hierarchy_json, and {dataset_name!r} has none"
            )
        self._dataset_name = dataset_name
        self._meta = meta
        self._distributed = distributed
        self._output_dir = output_dir
        self._expand_detections = expand_detections
        self._predictions = []

    @classmethod
    def from_config(cls, cfg, dataset_name: str, output_dir: Optional[str] = None):
        # TEST.OPENIMAGES.EXPAND_DETECTIONS applies to datasets with a hierarchy; a
        # dataset registered without one has no ancestors to copy detections to.
        has_hierarchy = bool(MetadataCatalog.get(dataset_name).get("hierarchy_json"))
        return {
            "dataset_name": dataset_name,
            "distributed": True,
            "output_dir": output_dir,
            "expand_detections": cfg.TEST.OPENIMAGES.EXPAND_DETECTIONS and has_hierarchy,
        }

    def reset(self) -> None:
        self._predictions = []

    def process(self, inputs, outputs) -> None:
        """Keep each image's detections in normalised coordinates."""
        for inp, out in zip(inputs, outputs):
            instances = out["instances"].to("cpu")
            height, width = instances.image_size
            boxes = instances.pred_boxes.tensor.numpy().astype(np.float64) / (
                width,
                height,
                width,
                height,
            )
            self._predictions.append(
                (
                    str(inp["image_id"]),
                    np.clip(boxes, 0.0, 1.0).astype(np.float32),
                    instances.scores.numpy().astype(np.float32),
                    instances.pred_classes.numpy().astype(np.int32),
                )
            )

    def evaluate(self):
        if self._distributed:
            comm.synchronize()
            gathered = comm.gather(self._predictions, dst=0)
            if not comm.is_main_process():
                return {}
            predictions = [p for part in gathered for p in part]
        else:
            predictions = self._predictions
        if not predictions:
            logger.warning("OIDEvaluator on %s received no predictions", self._dataset_name)
            return {}

        meta = self._meta
        ground_truth = load_openimages_ground_truth(
            meta.boxes_csv,
            meta.class_descriptions_csv,
            meta.image_labels_csv,
            meta.hierarchy_json or None,
            class_subset_csv=meta.class_subset_csv,
            cache_dir=meta.cache_dir,
        )
        ann, class_indices = ground_truth.annotations, ground_truth.class_indices
        hierarchy = ground_truth.hierarchy

        image_index = ann.image_index([p[0] for p in predictions])
        if (image_index < 0).any():
            raise ValueError(
                f"{int((image_index < 0).sum())} processed images are not in {meta.boxes_csv} nor in "
                f"{meta.image_labels_csv}, e.g. {predictions[int(np.argmin(image_index))][0]!r}"
            )
        images = np.unique(image_index)
        counts = [len(p[2]) for p in predictions]
        detections = OIDDetections(
            images=np.repeat(np.searchsorted(images, image_index), counts),
            boxes=np.concatenate([p[1] for p in predictions]).astype(np.float64).reshape(-1, 4),
            scores=np.concatenate([p[2] for p in predictions]).astype(np.float64),
            labels=class_indices[np.concatenate([p[3] for p in predictions]).astype(np.int64)],
        )
        if self._expand_detections:
            detections = expand_detections(detections, hierarchy)
        gt = OIDGroundTruth.from_annotations(ann, images)
        result = evaluate_detections(
            gt, detections, hierarchy=hierarchy, class_indices=class_indices
        )

        if self._output_dir:
            PathManager.mkdirs(self._output_dir)
            write_detections_csv(
                os.path.join(self._output_dir, "oid_detections.csv"),
                detections,
                gt.image_ids,
                ann.label_names,
            )
            write_per_class_csv(
                os.path.join(self._output_dir, "oid_per_class_ap.csv"),
                result,
                ann.label_names,
                ann.display_names,
            )

        logger.info(
            "Open Images mAP@0.5 of %s: %.4f over %d classes with ground truth (%d images)",
            self._dataset_name,
            result.mean_ap,
            int((result.num_ground_truth > 0).sum()),
            len(images),
        )
        metrics = OrderedDict(AP50=100.0 * result.mean_ap)
        for c, ap in zip(result.class_indices.tolist(), result.average_precision.tolist()):
            if not np.isnan(ap):
                metrics[f"AP50-{ann.display_names[c]}"] = 100.0 * ap
        return OrderedDict(bbox=metrics)
