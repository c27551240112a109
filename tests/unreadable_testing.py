"""Shared by the tests of unreadable images: copies of a dataset's images with some made
unreadable, in the three ways large datasets have them."""

from __future__ import annotations

import copy
import os
import shutil
from typing import Dict, List, Mapping

import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog

# What each kind of damage makes PIL (through Detectron2's read_image) raise.
REASONS = {
    "truncated": "image file is truncated",
    "random_bytes": "cannot identify image file",
    "deleted": "No such file or directory",
}


def damaged_copies(dicts: List[Dict], out_dir, damage: Mapping[int, str]) -> List[Dict]:
    """Copies of ``dicts`` whose images are copied to ``out_dir``; ``damage`` maps an index
    to how its copy is made unreadable: "truncated" (the first half of the JPEG),
    "random_bytes" (2000 random bytes) or "deleted" (no file)."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for i, d in enumerate(dicts):
        d = copy.deepcopy(d)
        path = os.path.join(str(out_dir), f"{i:03d}_{os.path.basename(d['file_name'])}")
        kind = damage.get(i)
        if kind == "truncated":
            with open(d["file_name"], "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
        elif kind == "random_bytes":
            with open(path, "wb") as f:
                f.write(rng.bytes(2000))
        elif kind is None:
            shutil.copyfile(d["file_name"], path)
        elif kind != "deleted":
            raise ValueError(f"unknown damage {kind!r}")
        d["file_name"] = path
        out.append(d)
    return out


def register(name: str, dicts: List[Dict], like: str) -> str:
    """Register ``dicts`` as dataset ``name`` with the metadata classes of dataset ``like``
    (replacing an earlier registration); return ``name``."""
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, lambda: copy.deepcopy(dicts))
    MetadataCatalog.get(name).set(
        thing_classes=MetadataCatalog.get(like).thing_classes,
        thing_dataset_id_to_contiguous_id=MetadataCatalog.get(like).thing_dataset_id_to_contiguous_id,
        evaluator_type="coco",
    )
    return name
