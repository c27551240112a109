"""The built-in "shapes" detection dataset: generated on first use, COCO format.

Images are real JPEG files of circles, squares and triangles (varied size,
colour, rotation and overlap) on noisy plain backgrounds. Annotations are a COCO
instances file per split, with the *visible* part of each shape as an RLE mask
and its bounding box; shapes hidden for more than half by later shapes are left
out. The same seed writes the same bytes. The dataset is written once under
:func:`~largedet.data.locations.datasets_root` (``$LARGEDET_DATASETS``, default
``~/.cache/largedet/datasets``) and registered in Detectron2's catalogs as
``shapes_train`` and ``shapes_val``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import cv2
import numpy as np
import pycocotools.mask as mask_util

from .locations import build_once, datasets_root

logger = logging.getLogger(__name__)

CLASSES = ("circle", "square", "triangle")
SPLITS = ("train", "val")
_MIN_VISIBLE = 0.5  # shapes with less of their area visible are not annotated
_FORMAT_VERSION = 1  # bump when the generator's output changes


@dataclass(frozen=True)
class ShapesSpec:
    """What to generate. Images are square, ``image_size`` pixels a side."""

    num_train: int = 1500
    num_val: int = 150
    image_size: int = 128
    seed: int = 0
    root: str = ""

    def __post_init__(self):
        for key in ("num_train", "num_val"):
            if getattr(self, key) < 1:
                raise ValueError(f"shapes dataset: {key} must be >= 1, got {getattr(self, key)}")
        if self.image_size < 32:
            raise ValueError(f"shapes dataset: image_size must be >= 32, got {self.image_size}")

    @property
    def directory(self) -> str:
        name = (
            f"shapes_v{_FORMAT_VERSION}_{self.image_size}px_"
            f"{self.num_train}train_{self.num_val}val_seed{self.seed}"
        )
        return os.path.join(self.root or datasets_root(), name)

    def num_images(self, split: str) -> int:
        return {"train": self.num_train, "val": self.num_val}[split]

    def image_root(self, split: str) -> str:
        return os.path.join(self.directory, split)

    def json_file(self, split: str) -> str:
        return os.path.join(self.directory, f"instances_{split}.json")


def _draw_shape(canvas: np.ndarray, kind: str, cx: float, cy: float, r: float, angle: float, color):
    """Draw one filled shape on ``canvas`` (H, W, C) in place."""
    if kind == "circle":
        cv2.circle(canvas, (round(cx), round(cy)), max(1, round(r)), color, thickness=-1, lineType=cv2.LINE_8)
        return
    corners = 4 if kind == "square" else 3
    theta = angle + np.arange(corners) * (2 * np.pi / corners)
    # a square of "radius" r has its corners on the circle of radius r*sqrt(2)
    rad = r * (np.sqrt(2.0) if kind == "square" else 1.2)
    pts = np.stack([cx + rad * np.cos(theta), cy + rad * np.sin(theta)], axis=1)
    cv2.fillPoly(canvas, [np.round(pts).astype(np.int32)], color, lineType=cv2.LINE_8)


def _render_image(rng: np.random.Generator, size: int):
    """One image (H, W, 3) uint8 BGR and its visible instances [(class_id, mask)]."""
    background = rng.integers(0, 256, size=3)
    image = np.empty((size, size, 3), dtype=np.float32)
    image[:] = background
    image += rng.normal(0.0, rng.uniform(4.0, 16.0), size=image.shape)

    owner = np.full((size, size), -1, dtype=np.int32)  # which shape is on top at each pixel
    shapes = []
    for index in range(int(rng.integers(1, 6))):
        kind = int(rng.integers(len(CLASSES)))
        r = rng.uniform(0.06, 0.22) * size
        cx, cy = rng.uniform(r, size - r, size=2)
        angle = rng.uniform(0, 2 * np.pi)
        color = rng.integers(0, 256, size=3)
        # keep the shape distinguishable from the background
        while np.abs(color.astype(int) - background.astype(int)).sum() < 120:
            color = rng.integers(0, 256, size=3)
        full = np.zeros((size, size), dtype=np.uint8)
        _draw_shape(full, CLASSES[kind], cx, cy, r, angle, 1)
        full = full.astype(bool)
        if full.sum() < 16:
            continue
        image[full] = color + rng.normal(0.0, 6.0, size=(int(full.sum()), 3))
        owner[full] = index
        shapes.append((index, kind, full))

    instances = []
    for index, kind, full in shapes:
        visible = owner == index
        if visible.sum() >= _MIN_VISIBLE * full.sum():
            instances.append((kind, visible))
    return np.clip(image, 0, 255).astype(np.uint8), instances


def _generate_split(spec: ShapesSpec, split: str, out_dir: str) -> None:
    os.makedirs(os.path.join(out_dir, split))
    split_seed = np.random.SeedSequence([spec.seed, SPLITS.index(split)])
    images, annotations = [], []
    for image_id, child in enumerate(split_seed.spawn(spec.num_images(split)), start=1):
        image, instances = _render_image(np.random.default_rng(child), spec.image_size)
        file_name = f"{image_id:06d}.jpg"
        ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise RuntimeError(f"could not encode {file_name}")
        with open(os.path.join(out_dir, split, file_name), "wb") as f:
            f.write(encoded.tobytes())
        images.append({"id": image_id, "file_name": file_name, "height": spec.image_size, "width": spec.image_size})
        for kind, mask in instances:
            rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
            x, y, w, h = (float(v) for v in mask_util.toBbox(rle))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": kind + 1,
                    "bbox": [x, y, w, h],
                    "area": float(mask_util.area(rle)),
                    "iscrowd": 0,
                    "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")},
                }
            )
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]
    coco = {
        "info": {"description": f"largedet shapes ({split}), seed {spec.seed}"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    with open(os.path.join(out_dir, f"instances_{split}.json"), "w") as f:
        json.dump(coco, f)


def generate_shapes(spec: ShapesSpec) -> str:
    """Write the dataset described by ``spec`` unless it is already there; return its folder.

    Written once (:func:`~largedet.data.locations.build_once`): in a temporary folder
    renamed into place at the end, under a lock, so an interrupted run never leaves a
    half-written dataset and of concurrent callers (several training processes) one
    writes while the others wait for it.
    """

    def build(out_dir: str) -> None:
        logger.info("Generating the shapes dataset into %s ...", spec.directory)
        for split in SPLITS:
            _generate_split(spec, split, out_dir)
        logger.info("Shapes dataset ready: %d train / %d val images.", spec.num_train, spec.num_val)

    return build_once(
        spec.directory, build, is_complete=lambda folder: os.path.isfile(spec.json_file("val"))
    )


def register_shapes(spec: ShapesSpec = ShapesSpec(), prefix: str = "shapes") -> None:
    """Register ``{prefix}_train`` and ``{prefix}_val`` (replacing earlier registrations).

    Generation happens lazily, the first time a split's dicts are asked for, or
    at once with :func:`generate_shapes`.
    """
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import load_coco_json

    for split in SPLITS:
        name = f"{prefix}_{split}"

        def load(split=split, name=name):
            generate_shapes(spec)
            return load_coco_json(spec.json_file(split), spec.image_root(split), name)

        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        DatasetCatalog.register(name, load)
        MetadataCatalog.get(name).set(
            thing_classes=list(CLASSES),
            json_file=spec.json_file(split),
            image_root=spec.image_root(split),
            evaluator_type="coco",
            shapes_spec=spec,
        )


def shapes_spec_from_config(cfg) -> ShapesSpec:
    """The :class:`ShapesSpec` that ``cfg.DATASETS.SHAPES`` describes."""
    c = cfg.DATASETS.SHAPES
    return ShapesSpec(num_train=c.NUM_TRAIN, num_val=c.NUM_VAL, image_size=c.IMAGE_SIZE, seed=c.SEED, root=c.ROOT)
