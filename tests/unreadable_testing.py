"""Shared by the tests of unreadable images: copies of a dataset's images with some made
unreadable, in the three ways large datasets have them."""

from __future__ import annotations

import copy
import os
import shutil
import struct
import zlib
from typing import Dict, List, Mapping

import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog

# What each kind of damage makes PIL (through Detectron2's read_image) raise.
REASONS = {
    "truncated": "image file is truncated",
    "random_bytes": "cannot identify image file",
    "deleted": "No such file or directory",
    "bomb": "over DATALOADER.MAX_IMAGE_PIXELS",
}


def decompression_bomb(path: str, side: int = 20000) -> None:
    """A PNG whose header says ``side`` x ``side`` pixels (400 million by default, over twice
    PIL's limit) in a few hundred bytes: what a decompression bomb looks like to a reader."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit grey
    rows = zlib.compress(b"\0" * (side + 1) * 4, 9)  # the first rows; the decoder never gets there
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def damaged_copies(dicts: List[Dict], out_dir, damage: Mapping[int, str]) -> List[Dict]:
    """Copies of ``dicts`` whose images are copied to ``out_dir``; ``damage`` maps an index
    to how its copy is made unreadable: "truncated" (the first half of the JPEG),
    "random_bytes" (2000 random bytes), "deleted" (no file) or "bomb" (a
    :func:`decompression_bomb`)."""
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
        elif kind == "bomb":
            decompression_bomb(path)
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
