"""The study's cells on a lent GPU machine that gives back only a few files: their progress,
seconds per iteration, and their run directories packed into a few bundles and unpacked where a
resumed study looks (``study/study_cells_on_gpu.py``)."""

from __future__ import annotations

import glob
import json
import os
import re
import tarfile
from typing import Dict, List, Optional

__all__ = ["PACK_LIMIT", "pack_cells", "progress", "seconds_per_iteration", "unpack_cells"]

#: bytes of one bundle at most
PACK_LIMIT = 15 * 1024 * 1024


def progress(run_dir: str) -> Dict[str, float]:
    """The cell's last logged iteration and its MAX_ITER (0 where nothing is logged yet)."""
    it, max_iter = 0, 0
    try:
        with open(os.path.join(run_dir, "metrics.json")) as f:
            for line in f:
                try:
                    it = max(it, int(json.loads(line).get("iteration", 0)))
                except (ValueError, AttributeError):
                    pass
    except OSError:
        pass
    try:
        with open(os.path.join(run_dir, "config.yaml")) as f:
            for line in f:
                if line.strip().startswith("MAX_ITER:"):
                    max_iter = int(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return {"iteration": it, "max_iter": max_iter}


def seconds_per_iteration(log_path: str) -> Optional[float]:
    """The last ``time:`` (Detectron2's mean seconds per iteration) in a training log."""
    found = None
    try:
        with open(log_path) as f:
            for line in f:
                m = re.search(r"\biter: \d+\b.*?\btime: ([0-9.]+)", line)
                if m:
                    found = float(m.group(1))
    except OSError:
        pass
    return found


def pack_cells(output_dir: str, cells: List[str], dest: str, budget: int) -> List[str]:
    """Tar each cell's run directory (only the checkpoint ``last_checkpoint`` names) into
    bundles under PACK_LIMIT bytes, at most ``budget`` files; returns the files written."""
    entries = []  # (cell, [paths relative to output_dir], bytes)
    for cell in cells:
        run_dir = os.path.join(output_dir, cell)
        if not os.path.isdir(run_dir):
            continue
        keep = None
        try:
            with open(os.path.join(run_dir, "last_checkpoint")) as f:
                keep = f.read().strip()
        except OSError:
            pass
        files = []
        for name in sorted(os.listdir(run_dir)):
            if name.endswith(".pth") and name != keep:
                continue
            if name.startswith("events.out") or name.endswith(".lock"):
                continue
            files.append(os.path.join(cell, name))
        size = sum(os.path.getsize(os.path.join(output_dir, p)) for p in files)
        entries.append((cell, files, size))
    bundles: List[List[str]] = []
    sizes: List[int] = []
    for _, files, size in entries:
        for i, used in enumerate(sizes):
            if used + size <= PACK_LIMIT:
                bundles[i] += files
                sizes[i] += size
                break
        else:
            bundles.append(list(files))
            sizes.append(size)
    written = []
    for i, files in enumerate(bundles[:budget]):
        path = os.path.join(dest, f"cells_{i}.tar.gz")
        with tarfile.open(path, "w:gz") as tar:
            for rel in files:
                tar.add(os.path.join(output_dir, rel), arcname=rel)
        written.append(path)
    return written


def unpack_cells(folder: str, output_dir: str) -> List[str]:
    """Unpack the ``cells_<i>.tar.gz`` of ``pack_cells`` in ``folder`` into
    ``output_dir`` (refusing paths that leave it); returns the bundles unpacked."""
    bundles = sorted(glob.glob(os.path.join(folder, "cells_*.tar.gz")))
    for bundle in bundles:
        with tarfile.open(bundle) as tar:
            tar.extractall(output_dir, filter="data")
    return bundles
