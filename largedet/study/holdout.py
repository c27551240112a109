"""A larger held-out split for the study's finished cells: each cell's final model evaluated
again on ``shapes_holdout_val`` with more images (the first 150 are the split every cell
was evaluated on; the generator draws image ``i`` from the same seed whatever the count).

The study chooses its recipe on the held-out split; with 150 images, differences of about
one AP between cells are within that split's sampling noise. Nothing is trained here: one
``tools/train_net.py --eval-only`` per cell, on its ``config.yaml`` and ``model_final.pth``,
a CSV row per cell (resumable: cells already in the CSV are skipped).
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from .grid import HOLDOUT_SET

__all__ = ["HOLDOUT_FIELDS", "eval_overrides", "evaluate_holdout", "last_copypaste_ap"]

HOLDOUT_FIELDS = ("cell", "holdout_images", "box_ap", "ap50", "ap75", "wall_clock_s", "device")

_COPYPASTE = re.compile(r"copypaste: ([-0-9.naN]+),([-0-9.naN]+),([-0-9.naN]+),")


def last_copypaste_ap(log_text: str) -> Optional[Dict[str, str]]:
    """AP, AP50 and AP75 (two decimals) of the last evaluation Detectron2 printed
    (its ``copypaste:`` lines); None when there is none. NaN (nothing detected) is 0."""
    found = _COPYPASTE.findall(log_text)
    if not found:
        return None

    def value(text: str) -> str:
        x = float(text)
        return "0.00" if x != x else f"{x:.2f}"

    return dict(zip(("box_ap", "ap50", "ap75"), (value(v) for v in found[-1])))


def eval_overrides(run_dir: str, images: int) -> List[str]:
    """The command-line overrides that evaluate ``run_dir``'s final model on the held-out
    split with ``images`` images, into ``run_dir/holdout_<images>``."""
    return [
        "MODEL.WEIGHTS", os.path.join(run_dir, "model_final.pth"),
        "DATASETS.SHAPES.NUM_VAL", str(images),
        "DATASETS.TEST", f"('{HOLDOUT_SET}',)",
        "OUTPUT_DIR", os.path.join(run_dir, f"holdout_{images}"),
    ]  # fmt: skip


def _read_rows(path: str) -> Dict[str, dict]:
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {row["cell"]: row for row in csv.DictReader(f)}


def evaluate_holdout(
    cells: Sequence[str],
    study_rows: Dict[str, dict],
    output_dir: str,
    images: int,
    csv_path: str,
    train_net: str,
    threads: int = 1,
    device_label: str = "",
) -> List[str]:
    """Evaluate every cell of ``cells`` that finished without diverging (a row of
    ``study_rows``) and has ``output_dir/<cell>/model_final.pth``, unless ``csv_path`` has
    it already; append a row per cell. Returns the cells evaluated now."""
    done = _read_rows(csv_path)
    evaluated = []
    for name in cells:
        row = study_rows.get(name)
        run_dir = os.path.join(output_dir, name)
        if name in done or row is None or row.get("diverged") == "yes":
            continue
        if not os.path.exists(os.path.join(run_dir, "model_final.pth")):
            print(f"{name}: no model_final.pth in {run_dir}, skipped", flush=True)
            continue
        cmd = [sys.executable, train_net, "--config", os.path.join(run_dir, "config.yaml"),
               "--eval-only", *eval_overrides(run_dir, images)]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        text = proc.stdout + proc.stderr
        ap = last_copypaste_ap(text) if proc.returncode == 0 else None
        if ap is None:
            tail = "\n".join(text.strip().splitlines()[-5:])
            raise RuntimeError(f"{name}: evaluation failed (exit {proc.returncode}):\n{tail}")
        new = not os.path.exists(csv_path)
        with open(csv_path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=HOLDOUT_FIELDS)
            if new:
                writer.writeheader()
            writer.writerow({"cell": name, "holdout_images": images, **ap,
                             "wall_clock_s": f"{wall:.1f}", "device": device_label})  # fmt: skip
        print(f"{name}: held-out AP on {images} images {ap['box_ap']} ({wall:.0f} s)", flush=True)
        evaluated.append(name)
    return evaluated
