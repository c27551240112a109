"""Seeded COCO-like ground truth and detections (boxes, masks, crowd regions): the data of
``benchmarks/coco_eval_speed.py`` and of the test that faster-coco-eval gives pycocotools'
numbers (``tests/evaluation/test_faster_coco_eval.py``); and that ground truth written as a
training set of COCO-size JPEGs (``write_synthetic_coco``), the data of
``benchmarks/loader_speed.py`` and ``benchmarks/trainer_overhead.py --coco-images``. Test and
benchmark data, not part of the library."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

__all__ = ["INSTANCES_JSON", "synthetic_coco_instances", "synthetic_photo", "write_synthetic_coco"]

#: the name of the instances file that ``write_synthetic_coco`` writes beside its JPEGs
INSTANCES_JSON = "instances.json"

# Frequent COCO image sizes, (width, height).
_COCO_IMAGE_SIZES = ((640, 480), (640, 427), (480, 640), (640, 426), (427, 640), (640, 424), (500, 375), (612, 612))


def _random_boxes(rng: np.random.Generator, n: int, width: int, height: int, median_side: float) -> np.ndarray:
    """(n, 4) XYWH boxes inside the image: the side (square root of the area) log-normal
    around ``median_side`` pixels (sigma 1.2), the aspect ratio log-normal around 1."""
    side = np.exp(rng.normal(np.log(median_side), 1.2, n))
    aspect = np.exp(rng.normal(0.0, 0.5, n))
    w = np.clip(side * np.sqrt(aspect), 2.0, width)
    h = np.clip(side / np.sqrt(aspect), 2.0, height)
    x = rng.uniform(0.0, 1.0, n) * (width - w)
    y = rng.uniform(0.0, 1.0, n) * (height - h)
    return np.stack([x, y, w, h], axis=1)


def _ellipse_polygons(rng: np.random.Generator, boxes: np.ndarray, vertices: int = 16) -> list:
    """One polygon ``[x1, y1, x2, y2, ...]`` per box: the inscribed ellipse with each
    radius shrunk by a random 0-15%, so that masks differ from their boxes and each other."""
    angle = np.linspace(0.0, 2.0 * np.pi, vertices, endpoint=False)
    radius = rng.uniform(0.85, 1.0, (len(boxes), vertices))
    cx, cy = boxes[:, 0:1] + boxes[:, 2:3] / 2, boxes[:, 1:2] + boxes[:, 3:4] / 2
    px = cx + boxes[:, 2:3] / 2 * radius * np.cos(angle)
    py = cy + boxes[:, 3:4] / 2 * radius * np.sin(angle)
    return [np.round(np.stack([x, y], axis=1).ravel(), 2).tolist() for x, y in zip(px, py)]


def _uncompressed_rle(rle: dict) -> dict:
    """COCO's uncompressed RLE (``counts`` a list, as the crowd regions of instances_val2017.json)."""
    from pycocotools import mask as mask_util

    flat = mask_util.decode(rle).ravel(order="F")
    ends = np.concatenate([np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    counts = np.diff(np.concatenate([[0], ends])).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"counts": counts, "size": list(rle["size"])}


def synthetic_coco_instances(
    num_images: int,
    *,
    num_categories: int = 80,
    gt_per_image: float = 7.4,
    dets_per_image: int = 100,
    crowd_fraction: float = 0.01,
    seed: int = 0,
) -> tuple[dict, list]:
    """Seeded COCO-like ground truth and detections, ``(instances dict, results list)``.

    At the defaults and 5,000 images it has the shape of COCO val2017 and a Mask R-CNN's
    results on it: frequent COCO image sizes, Poisson(``gt_per_image``) objects per image
    (val2017: 36,781 on 5,000 images, 7.4 each) with polygon masks and box sides log-normal
    around 50 px (by mask area about 42% small, 34% medium, 24% large; val2017: 41/34/24),
    ``crowd_fraction`` of them crowd regions (``iscrowd`` 1, uncompressed RLE, larger);
    ``dets_per_image`` detections per image, each with ``bbox``, a compressed-RLE
    ``segmentation`` and a score: 1 + Poisson(1) noisy copies of each object (10% with
    another category, scores in 0.3-1), then false positives (scores in 0-0.6), the top
    ``dets_per_image`` by score kept.
    Category ids are 1..``num_categories``; image and annotation ids start at 1.
    """
    from pycocotools import mask as mask_util

    rng = np.random.default_rng(seed)
    images, annotations, results = [], [], []
    for image_id in range(1, num_images + 1):
        width, height = _COCO_IMAGE_SIZES[rng.integers(len(_COCO_IMAGE_SIZES))]
        images.append({"id": image_id, "width": width, "height": height, "file_name": f"{image_id:012d}.jpg"})

        n = int(rng.poisson(gt_per_image))
        crowd = rng.random(n) < crowd_fraction
        boxes = _random_boxes(rng, n, width, height, median_side=50.0)
        boxes[crowd] = _random_boxes(rng, int(crowd.sum()), width, height, median_side=150.0)
        categories = rng.integers(1, num_categories + 1, n)
        polygons = _ellipse_polygons(rng, boxes)
        for category, is_crowd, polygon in zip(categories, crowd, polygons):
            rle = mask_util.frPyObjects([polygon], height, width)[0]
            xs, ys = polygon[0::2], polygon[1::2]
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": int(category),
                "segmentation": _uncompressed_rle(rle) if is_crowd else [polygon],
                "area": float(mask_util.area(rle)),
                "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)],
                "iscrowd": int(is_crowd),
            })  # fmt: skip

        copies = 1 + rng.poisson(1.0, n)
        true_boxes = np.repeat(boxes, copies, axis=0)
        true_boxes = true_boxes + rng.normal(0.0, 0.1, true_boxes.shape) * true_boxes[:, [2, 3, 2, 3]]
        true_categories = np.repeat(categories, copies)
        relabel = rng.random(len(true_categories)) < 0.1
        true_categories[relabel] = rng.integers(1, num_categories + 1, int(relabel.sum()))
        num_false = max(dets_per_image - len(true_boxes), 0)
        det_boxes = np.concatenate([true_boxes, _random_boxes(rng, num_false, width, height, median_side=50.0)])
        det_categories = np.concatenate([true_categories, rng.integers(1, num_categories + 1, num_false)])
        scores = np.concatenate([rng.uniform(0.3, 1.0, len(true_boxes)), rng.uniform(0.0, 0.6, num_false)])
        # Clip to the image as a detector's boxes are, then keep the top detections.
        x0 = np.clip(det_boxes[:, 0], 0, width)
        y0 = np.clip(det_boxes[:, 1], 0, height)
        x1 = np.clip(det_boxes[:, 0] + np.maximum(det_boxes[:, 2], 1.0), 0, width)
        y1 = np.clip(det_boxes[:, 1] + np.maximum(det_boxes[:, 3], 1.0), 0, height)
        det_boxes = np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)
        keep = np.argsort(-scores, kind="stable")[:dets_per_image]
        polygons = _ellipse_polygons(rng, det_boxes[keep])
        rles = mask_util.frPyObjects(polygons, height, width) if polygons else []
        for i, rle in zip(keep, rles):
            results.append({
                "image_id": image_id,
                "category_id": int(det_categories[i]),
                "bbox": [round(float(v), 2) for v in det_boxes[i]],
                "score": round(float(scores[i]), 5),
                "segmentation": {"counts": rle["counts"].decode("ascii"), "size": list(rle["size"])},
            })  # fmt: skip

    categories = [{"id": c, "name": f"category_{c}", "supercategory": "thing"} for c in range(1, num_categories + 1)]
    return {"images": images, "annotations": annotations, "categories": categories}, results


def _octaves(
    rng: np.random.Generator, height: int, width: int, channels: int, finest: int, coarsest: int, amplitude: float
) -> np.ndarray:
    """(height, width, channels) float32 noise with power falling with frequency as in
    photographs: Gaussian noise on grids of ``s`` pixels (``s`` = ``finest``, twice that,
    ... ``coarsest``) upsampled bicubically, each with standard deviation
    ``amplitude * sqrt(s / 256)``."""
    import cv2

    out = np.zeros((height, width, channels), np.float32)
    s = finest
    while s <= coarsest:
        shape = (max(2, -(-height // s)), max(2, -(-width // s)), channels)  # sides rounded up
        grid = rng.standard_normal(shape, dtype=np.float32)
        if s > 1:
            grid = cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)
            grid = grid.reshape(height, width, channels)  # cv2 drops a last axis of 1
        out += amplitude * np.sqrt(s / 256.0) * grid
        s *= 2
    return out


def synthetic_photo(rng: np.random.Generator, height: int, width: int, polygons=()) -> np.ndarray:
    """A (height, width, 3) uint8 RGB image that JPEG compresses as a photograph does: about
    4.2 bits per pixel at quality 90 (about 160 KB at 640 x 480, near the mean size of COCO's
    train2017 JPEGs). Coloured clouds (noise of 8-512 px grids) as background, each polygon
    (``[x1, y1, x2, y2, ...]`` in pixels, an object's outline) filled with a flat random
    colour over it, then grey texture of 1-16 px grids over everything."""
    import cv2

    image = 110.0 + _octaves(rng, height, width, 3, 8, 512, 25.0)  # colour
    image += _octaves(rng, height, width, 1, 8, 512, 30.0)  # brightness
    for polygon in polygons:
        points = np.round(np.asarray(polygon, np.float32).reshape(-1, 2)).astype(np.int32)
        cv2.fillPoly(image, [points], tuple(float(c) for c in rng.uniform(40.0, 200.0, 3)))
    image += _octaves(rng, height, width, 1, 1, 16, 200.0)
    return np.clip(image, 0, 255).astype(np.uint8)


def _write_photos(folder: str, images: list, polygons: dict, seed: int, quality: int) -> int:
    """Write each image's JPEG (``synthetic_photo``, the generator seeded by ``seed`` and the
    image id); returns the bytes written."""
    from PIL import Image

    written = 0
    for image in images:
        rng = np.random.default_rng([seed, image["id"]])
        pixels = synthetic_photo(rng, image["height"], image["width"], polygons.get(image["id"], ()))
        path = os.path.join(folder, image["file_name"])
        Image.fromarray(pixels).save(path, "JPEG", quality=quality)
        written += os.path.getsize(path)
    return written


def write_synthetic_coco(
    folder: str, num_images: int, *, seed: int = 0, quality: int = 90, jobs: int = 1
) -> tuple[str, int]:
    """Write a COCO-format training set of ``num_images`` JPEGs into ``folder``; returns
    ``(instances file, bytes of the JPEGs)``.

    The ground truth is ``synthetic_coco_instances(num_images, seed=seed)`` without its
    detections: COCO's frequent image sizes (about 640 x 480), 7.4 objects per image (80
    categories, polygon masks, 1% crowd regions). Each image is ``synthetic_photo`` with the
    image's objects (crowd regions left out) drawn in, saved at JPEG ``quality``; the files
    are ``folder/<id as 12 digits>.jpg`` and ``folder/instances.json`` (``INSTANCES_JSON``).

    Args:
        folder: where to write (created if missing).
        num_images: images to write.
        seed: the annotations' and the pixels' seed; the same seed writes the same bytes.
        quality: JPEG quality (PIL, 4:2:0 chroma subsampling).
        jobs: processes that write the JPEGs (1: this process).
    """
    gt, _ = synthetic_coco_instances(num_images, dets_per_image=0, seed=seed)
    os.makedirs(folder, exist_ok=True)
    polygons: dict = {}
    for annotation in gt["annotations"]:
        if not annotation["iscrowd"]:
            polygons.setdefault(annotation["image_id"], []).extend(annotation["segmentation"])
    jobs = max(1, min(jobs, num_images))
    if jobs == 1:
        written = _write_photos(folder, gt["images"], polygons, seed, quality)
    else:
        with ProcessPoolExecutor(jobs) as pool:
            chunks = [gt["images"][i::jobs] for i in range(jobs)]
            futures = [pool.submit(_write_photos, folder, chunk, polygons, seed, quality) for chunk in chunks]
            written = sum(future.result() for future in futures)
    json_file = os.path.join(folder, INSTANCES_JSON)
    with open(json_file, "w") as f:
        json.dump(gt, f)
    return json_file, written
