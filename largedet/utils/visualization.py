"""Pictures of what a detector sees: predictions and ground truth drawn on images with
Detectron2's ``Visualizer``, and a COCO results file turned back into per-image
``Instances``.

Used by ``tools/predict.py`` (a model's predictions on images) and
``tools/visualize_json_results.py`` (a results file beside the ground truth). Pictures are
RGB ``uint8`` arrays ``(H * scale, W * scale, 3)``; at ``scale`` 1 with nothing to draw a
picture is the image itself, pixel for pixel.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np
import torch
from detectron2.structures import Boxes, BoxMode, Instances
from detectron2.utils.visualizer import Visualizer

__all__ = [
    "ResultsFileError",
    "draw_ground_truth",
    "draw_predictions",
    "load_coco_results",
    "results_to_instances",
    "side_by_side",
    "tile",
]


class ResultsFileError(ValueError):
    """A results file that cannot be drawn; one line naming the file and the entry."""


def draw_predictions(
    image: np.ndarray,
    instances: Instances,
    metadata=None,
    *,
    threshold: float = 0.5,
    scale: float = 1.0,
) -> np.ndarray:
    """``image`` (RGB, (H, W, 3) uint8) with the boxes (and masks, where predicted) of the
    ``instances`` whose ``scores`` are >= ``threshold``, labelled with ``metadata``'s
    ``thing_classes`` and the score: the picture, RGB (H * scale, W * scale, 3) uint8."""
    instances = instances.to("cpu")
    if instances.has("scores"):
        instances = instances[instances.scores >= threshold]
    return Visualizer(image, metadata, scale=scale).draw_instance_predictions(instances).get_image()


def draw_ground_truth(
    image: np.ndarray, dataset_dict: Dict[str, Any], metadata=None, *, scale: float = 1.0
) -> np.ndarray:
    """``image`` (RGB) with the annotations of its Detectron2 dataset dict drawn."""
    return Visualizer(image, metadata, scale=scale).draw_dataset_dict(dataset_dict).get_image()


def _pad_to(picture: np.ndarray, height: int, width: int) -> np.ndarray:
    out = np.zeros((height, width, 3), dtype=np.uint8)
    out[: picture.shape[0], : picture.shape[1]] = picture
    return out


def side_by_side(pictures: Sequence[np.ndarray], gap: int = 4) -> np.ndarray:
    """The pictures in one row, top-aligned, ``gap`` black pixels between them."""
    return tile(pictures, columns=len(pictures), gap=gap)


def tile(pictures: Sequence[np.ndarray], columns: int = 4, gap: int = 4) -> np.ndarray:
    """The pictures in a grid of ``columns`` columns (row by row), each cell as large as the
    largest picture, ``gap`` black pixels between cells: RGB uint8."""
    if not pictures:
        raise ValueError("no pictures to tile")
    columns = max(1, min(columns, len(pictures)))
    rows = math.ceil(len(pictures) / columns)
    cell_h = max(p.shape[0] for p in pictures)
    cell_w = max(p.shape[1] for p in pictures)
    height, width = rows * cell_h + (rows - 1) * gap, columns * cell_w + (columns - 1) * gap
    grid = np.zeros((height, width, 3), np.uint8)
    for i, picture in enumerate(pictures):
        r, c = divmod(i, columns)
        y, x = r * (cell_h + gap), c * (cell_w + gap)
        grid[y : y + cell_h, x : x + cell_w] = _pad_to(picture, cell_h, cell_w)
    return grid


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_coco_results(path: str) -> Dict[Any, List[dict]]:
    """A COCO detection results file (``coco_instances_results.json``: a list of
    ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}``) grouped by image id.
    Raises :class:`ResultsFileError` naming the file and the first bad entry."""
    try:
        with open(path, "rb") as f:
            results = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsFileError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ResultsFileError(f"{path}: cannot read it: {e.strerror or e}") from None
    if not isinstance(results, list):
        raise ResultsFileError(
            f"{path}: a results file is a list of detections, got {type(results).__name__}"
        )
    by_image: Dict[Any, List[dict]] = defaultdict(list)
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise ResultsFileError(f"{path}: entry {i}: not an object")
        for key in ("image_id", "category_id", "bbox", "score"):
            if key not in r:
                raise ResultsFileError(f"{path}: entry {i}: no {key!r}")
        box = r["bbox"]
        if not isinstance(box, list) or len(box) != 4 or not all(map(_is_number, box)):
            raise ResultsFileError(
                f"{path}: entry {i}: bbox must be [x, y, width, height], got {box!r}"
            )
        if not _is_number(r["score"]):
            raise ResultsFileError(f"{path}: entry {i}: score must be a number, got {r['score']!r}")
        if isinstance(r["image_id"], (list, dict)):
            raise ResultsFileError(f"{path}: entry {i}: image_id must be a number or a string")
        by_image[r["image_id"]].append(r)
    return dict(by_image)


def results_to_instances(
    results: Sequence[dict],
    image_size: Tuple[int, int],
    dataset_id_to_contiguous_id: Mapping[int, int],
    path: str = "",
) -> Instances:
    """One image's COCO results as ``Instances`` of ``image_size`` (H, W) with
    ``pred_boxes`` (XYXY), ``scores`` and ``pred_classes`` (contiguous ids, through the
    dataset's ``thing_dataset_id_to_contiguous_id``). Raises :class:`ResultsFileError` for a
    ``category_id`` the dataset does not have (``path`` names the file)."""
    boxes, scores, classes = [], [], []
    for r in results:
        if r["category_id"] not in dataset_id_to_contiguous_id:
            known = ", ".join(map(str, sorted(dataset_id_to_contiguous_id)))
            raise ResultsFileError(
                f"{path}: image {r['image_id']!r}: category_id {r['category_id']!r} is not a "
                f"category of the dataset ({known})"
            )
        boxes.append(BoxMode.convert(r["bbox"], BoxMode.XYWH_ABS, BoxMode.XYXY_ABS))
        scores.append(float(r["score"]))
        classes.append(dataset_id_to_contiguous_id[r["category_id"]])
    instances = Instances(image_size)
    instances.pred_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
    instances.scores = torch.tensor(scores, dtype=torch.float32)
    instances.pred_classes = torch.tensor(classes, dtype=torch.int64)
    return instances
