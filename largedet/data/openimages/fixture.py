"""A tiny generated dataset in the official OpenImages layout, for tests and quick runs.

:func:`write_openimages_fixture` writes, as a root folder with the official file
names of :mod:`largedet.data.openimages` (so ``register_all_openimages(root)``
reads it like the real dataset): a six-class vocabulary with a hierarchy, its
four-class "challenge" subset, box and image-level label CSVs for a train and a
validation split, and JPEGs of shapes on noisy backgrounds.

Not imported by ``import largedet.data``: whoever uses the fixture imports this module
and registers it (:func:`register_openimages_fixture`), as the tests do in their
``conftest.py``.

Hierarchy (the root ``/m/0bl9f`` is not a class)::

    Shape ─┬─ Round ─┬─ Circle
           │         └─ Ring
           ├─ Square
           └─ Triangle

Boxes are annotated at the leaves (Circle, Ring, Square, Triangle); a cluster of
small discs is one group-of Circle box. Each image has positive image-level labels
for the leaf classes it shows and verified-negative labels for one or two absent
ones (sometimes "Round", which the metric propagates to Circle and Ring). Images
alternate between landscape and portrait.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

from detectron2.data import MetadataCatalog

from ..locations import build_once, datasets_root
from .annotations import BOX_FLAG_COLUMNS
from .dataset import (
    CHALLENGE500_CLASSES_CSV,
    CHALLENGE500_HIERARCHY_JSON,
    CLASS_DESCRIPTIONS_CSV,
    HIERARCHY_JSON,
    V6_SPLITS,
    register_openimages,
)

logger = logging.getLogger(__name__)

__all__ = [
    "FIXTURE_CLASSES",
    "default_fixture_root",
    "register_openimages_fixture",
    "write_openimages_fixture",
]

ROOT_LABEL = "/m/0bl9f"
# (LabelName, DisplayName, parent LabelName or None for the root's children).
FIXTURE_CLASSES: Tuple[Tuple[str, str, Optional[str]], ...] = (
    ("/m/0fx01", "Shape", None),
    ("/m/0fx02", "Round", "/m/0fx01"),
    ("/m/0fx03", "Circle", "/m/0fx02"),
    ("/m/0fx04", "Ring", "/m/0fx02"),
    ("/m/0fx05", "Square", "/m/0fx01"),
    ("/m/0fx06", "Triangle", "/m/0fx01"),
)
CHALLENGE_SUBSET = ("/m/0fx01", "/m/0fx02", "/m/0fx03", "/m/0fx05")
_LEAVES = ("/m/0fx03", "/m/0fx04", "/m/0fx05", "/m/0fx06")
_ROUND = "/m/0fx02"
_BOX_HEADER = [
    "ImageID",
    "Source",
    "LabelName",
    "Confidence",
    "XMin",
    "XMax",
    "YMin",
    "YMax",
    *BOX_FLAG_COLUMNS,
]
_LABEL_HEADER = ["ImageID", "Source", "LabelName", "Confidence"]
_STAMP = ".largedet-fixture.json"


def _hierarchy_tree(labels: Sequence[str]) -> dict:
    def node(label: str) -> dict:
        children = [c for c, _, p in FIXTURE_CLASSES if p == label and c in labels]
        out = {"LabelName": label}
        if children:
            out["Subcategory"] = [node(c) for c in children]
        return out

    return {
        "LabelName": ROOT_LABEL,
        "Subcategory": [node(c) for c, _, p in FIXTURE_CLASSES if p is None and c in labels],
    }


def _draw_image(rng: np.random.Generator, width: int, height: int):
    """One image and its boxes: a list of (LabelName, (x0, y0, x1, y1) in pixels, is_group_of)."""
    base = rng.integers(40, 200, size=3)
    pixels = np.clip(base + rng.normal(0, 12, size=(height, width, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    boxes = []
    side = min(width, height)
    for _ in range(int(rng.integers(1, 4))):
        label = _LEAVES[int(rng.integers(len(_LEAVES)))]
        size = int(rng.integers(side // 5, side // 2))
        x0 = int(rng.integers(0, width - size))
        y0 = int(rng.integers(0, height - size))
        x1, y1 = x0 + size, y0 + size
        color = tuple(int(c) for c in (255 - base + rng.integers(-30, 30, size=3)) % 256)
        if label == "/m/0fx03":
            draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=color)
        elif label == "/m/0fx04":
            draw.ellipse([x0, y0, x1 - 1, y1 - 1], outline=color, width=max(2, size // 6))
        elif label == "/m/0fx05":
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=color)
        else:
            draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1) / 2, y0)], fill=color)
        boxes.append((label, (x0, y0, x1, y1), False))
    if rng.random() < 0.3:  # a cluster of small discs, annotated as one group-of Circle box
        r = max(3, side // 24)
        cx, cy = int(rng.integers(4 * r, width - 4 * r)), int(rng.integers(4 * r, height - 4 * r))
        centers = [
            (cx + dx * 2 * r, cy + dy * 2 * r) for dx, dy in ((-1, -1), (1, -1), (-1, 1), (1, 1))
        ]
        for x, y in centers:
            draw.ellipse([x - r, y - r, x + r - 1, y + r - 1], fill=(250, 250, 250))
        boxes.append(("/m/0fx03", (cx - 3 * r, cy - 3 * r, cx + 3 * r, cy + 3 * r), True))
    return image, boxes


def _write_split(
    root: str, split: str, num_images: int, image_size: Tuple[int, int], rng: np.random.Generator
) -> None:
    files = V6_SPLITS[split]
    images_dir = os.path.join(root, files.images_dir)
    os.makedirs(images_dir, exist_ok=True)
    box_rows: List[list] = []
    label_rows: List[list] = []
    for i in range(num_images):
        image_id = f"{split[:2]}{i:014x}"
        width, height = image_size if i % 2 == 0 else image_size[::-1]
        image, boxes = _draw_image(rng, width, height)
        image.save(os.path.join(images_dir, image_id + ".jpg"), quality=90)
        for label, (x0, y0, x1, y1), group_of in boxes:
            flags = [int(rng.random() < 0.2), int(x0 == 0 or y0 == 0), int(group_of), 0, 0]
            box_rows.append(
                [
                    image_id,
                    "xclick",
                    label,
                    1,
                    f"{x0 / width:.6f}",
                    f"{x1 / width:.6f}",
                    f"{y0 / height:.6f}",
                    f"{y1 / height:.6f}",
                    *flags,
                ]
            )
        present = sorted({label for label, _, _ in boxes})
        label_rows += [[image_id, "verification", label, 1] for label in present]
        absent = [label for label in _LEAVES if label not in present]
        if not {"/m/0fx03", "/m/0fx04"} & set(present) and rng.random() < 0.5:
            label_rows.append([image_id, "verification", _ROUND, 0])
        else:
            for label in rng.permutation(absent)[: int(rng.integers(1, 3))].tolist():
                label_rows.append([image_id, "verification", label, 0])
    for name, header, rows in (
        (files.boxes_csv, _BOX_HEADER, box_rows),
        (files.image_labels_csv, _LABEL_HEADER, label_rows),
    ):
        with open(os.path.join(root, name), "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(rows)


def write_openimages_fixture(
    root: str,
    *,
    num_train: int = 48,
    num_val: int = 16,
    image_size: Tuple[int, int] = (128, 96),
    seed: int = 0,
) -> str:
    """Write the fixture as the folder ``root`` (official file names); returns ``root``.

    Written once (:func:`largedet.data.locations.build_once`): in a temporary folder
    renamed to ``root`` when complete, so a second call with the same arguments finds
    it and writes nothing, and processes calling at once wait for one writer. An empty
    folder ``root`` is replaced; one holding anything else (other files, the fixture
    written with other arguments) is a ``FileExistsError``, never overwritten.

    Args:
        num_train, num_val: images per split.
        image_size: (width, height) of the landscape images; every other image is
            portrait (height, width).
        seed: the same seed writes the same files.
    """
    params = {
        "num_train": num_train,
        "num_val": num_val,
        "image_size": list(image_size),
        "seed": seed,
        "version": 1,
    }

    def is_complete(folder: str) -> bool:
        stamp = os.path.join(folder, _STAMP)
        if not os.path.isfile(stamp):
            return False
        with open(stamp) as f:
            return json.load(f) == params

    def build(folder: str) -> None:
        rng = np.random.default_rng(seed)
        with open(os.path.join(folder, CLASS_DESCRIPTIONS_CSV), "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(
                [label, name] for label, name, _ in FIXTURE_CLASSES
            )
        with open(os.path.join(folder, CHALLENGE500_CLASSES_CSV), "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(
                [label, name] for label, name, _ in FIXTURE_CLASSES if label in CHALLENGE_SUBSET
            )
        for name, labels in (
            (HIERARCHY_JSON, [c for c, _, _ in FIXTURE_CLASSES]),
            (CHALLENGE500_HIERARCHY_JSON, CHALLENGE_SUBSET),
        ):
            with open(os.path.join(folder, name), "w") as f:
                json.dump(_hierarchy_tree(labels), f, indent=1)
        _write_split(folder, "train", num_train, image_size, rng)
        _write_split(folder, "val", num_val, image_size, rng)
        with open(os.path.join(folder, _STAMP), "w") as f:
            json.dump(params, f)
        logger.info(
            "Wrote the OpenImages fixture (%d train, %d val images) in %s", num_train, num_val, root
        )

    return build_once(root, build, is_complete=is_complete)


def default_fixture_root() -> str:
    """``<datasets root>/openimages_fixture``: ``$LARGEDET_DATASETS/openimages_fixture``, or
    ``~/.cache/largedet/datasets/openimages_fixture``
    (:func:`largedet.data.locations.datasets_root`)."""
    return os.path.join(datasets_root(), "openimages_fixture")


def register_openimages_fixture(
    root: Optional[str] = None, *, cache_dir: Optional[str] = None
) -> List[str]:
    """Register ``openimages_fixture_train`` and ``openimages_fixture_val`` (all six
    classes), written under ``root`` (default :func:`default_fixture_root`) on first use."""
    root = root or default_fixture_root()
    names = []
    for split in ("train", "val"):
        files = V6_SPLITS[split]
        name = f"openimages_fixture_{split}"
        register_openimages(
            name,
            os.path.join(root, files.boxes_csv),
            os.path.join(root, files.images_dir),
            os.path.join(root, CLASS_DESCRIPTIONS_CSV),
            os.path.join(root, files.image_labels_csv),
            os.path.join(root, HIERARCHY_JSON),
            filter_empty=files.filter_empty,
            cache_dir=cache_dir,
            prepare=lambda: write_openimages_fixture(root),
        )
        meta = MetadataCatalog.get(name)
        if "thing_classes" not in meta.as_dict():
            meta.set(
                thing_classes=[n for _, n, _ in FIXTURE_CLASSES],
                label_names=[c for c, _, _ in FIXTURE_CLASSES],
            )
        names.append(name)
    return names
