"""Larger evaluation splits for the study's finished cells: each cell's final model
evaluated again on ``shapes_holdout_val`` (the split that chooses the recipe) and on
``shapes_val`` (the reported one) with more images each. The first 150 images of each are
the ones every cell was evaluated on when it finished: the generator draws image ``i``
from the same seed whatever the count. The AP is read from the ``eval_results.json`` that
``--eval-only`` writes (:func:`largedet.launch.run_summary.read_eval_results`).

With 150 images, differences of about one AP between cells are within a split's sampling
noise. Nothing is trained here: one ``tools/train_net.py --eval-only`` per cell, on its
``config.yaml`` and ``model_final.pth``, a CSV row per cell (resumable: cells already in the
CSV are skipped).
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from largedet.launch.run_summary import EVAL_RESULTS_FILE, read_eval_results
from .grid import HOLDOUT_SET

REPORT_SET = "shapes_val"

__all__ = [
    "EVAL_SETS",
    "EVAL_FIELDS",
    "TRAINED_FIELDS",
    "append_row",
    "eval_ap",
    "eval_overrides",
    "read_csv_rows",
    "reevaluate_cells",
    "todo_cells",
]

# the evaluated splits in the order of DATASETS.TEST, each with its CSV columns (AP, AP50,
# AP75; the reported split's named as in the study CSV)
EVAL_SETS = (
    (HOLDOUT_SET, ("holdout_ap", "holdout_ap50", "holdout_ap75")),
    (REPORT_SET, ("box_ap", "ap50", "ap75")),
)
# a run with model EMA evaluated on "both" (MODEL_EMA.EVAL): its AP columns are the
# average's, and these the trained weights' (``model/<split>`` in its results); empty otherwise
TRAINED_FIELDS = ("trained_holdout_ap", "trained_box_ap")
EVAL_FIELDS = ("cell", "images", *(c for _, cols in EVAL_SETS for c in cols),
               "wall_clock_s", "device", *TRAINED_FIELDS)  # fmt: skip


def eval_ap(results: Optional[dict], prefix: str = "") -> Optional[List[Dict[str, str]]]:
    """AP, AP50 and AP75 (two decimals) of each split of :data:`EVAL_SETS`, in order, from
    an ``--eval-only`` run's results (``eval_results.json``), under ``prefix + split``
    ("model/" for the trained weights of a run evaluated with its EMA on "both"); None
    when a split is missing. NaN (nothing detected) is 0."""
    if results is None:
        return None

    def value(x: float) -> str:
        return "0.00" if math.isnan(x) else f"{x:.2f}"

    found = []
    for name, _ in EVAL_SETS:
        bbox = results.get(prefix + name, {}).get("bbox")
        if bbox is None:
            return None
        found.append({k: value(float(bbox[c])) for k, c in (("ap", "AP"), ("ap50", "AP50"), ("ap75", "AP75"))})
    return found


def eval_overrides(run_dir: str, images: int) -> List[str]:
    """The command-line overrides that evaluate ``run_dir``'s final model on the held-out
    and the reported split with ``images`` images each, into ``run_dir/eval_<images>``."""
    sets = "".join(f"'{name}', " for name, _ in EVAL_SETS)
    return [
        "MODEL.WEIGHTS", os.path.join(run_dir, "model_final.pth"),
        "DATASETS.SHAPES.NUM_VAL", str(images),
        "DATASETS.TEST", f"({sets})",
        "OUTPUT_DIR", os.path.join(run_dir, f"eval_{images}"),
    ]  # fmt: skip


def read_csv_rows(path: str) -> Dict[str, dict]:
    """The rows of a CSV by their ``cell`` column; none when the file does not exist."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {row["cell"]: row for row in csv.DictReader(f)}


def append_row(path: str, row: dict, fields: Sequence[str]) -> None:
    """Append ``row`` to the CSV ``path`` with the columns ``fields``, writing the header
    when the file is new or empty. A file written with fewer columns (an earlier version's
    prefix of ``fields``) is rewritten with the new header first, its rows kept (the new
    columns empty); any other header is an error naming the file."""
    header: List[str] = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
    if header and header != list(fields):
        if header != list(fields[: len(header)]):
            raise ValueError(f"{path}: columns {header} are not those of this CSV ({list(fields)})")
        with open(path, newline="") as f:
            kept = list(csv.DictReader(f))
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if f.tell() == 0:
            writer.writeheader()
        writer.writerow(row)


def todo_cells(
    cells: Sequence[str], study_rows: Dict[str, dict], output_dir: str, done: Dict[str, dict]
) -> List[str]:
    """The cells of ``cells`` to evaluate: finished without diverging (a row of
    ``study_rows``), with ``output_dir/<cell>/model_final.pth``, and not in ``done``. A
    finished cell without its final model is named and left out."""
    todo = []
    for name in cells:
        row = study_rows.get(name)
        if name in done or row is None or row.get("diverged") == "yes":
            continue
        run_dir = os.path.join(output_dir, name)
        if not os.path.exists(os.path.join(run_dir, "model_final.pth")):
            print(f"{name}: no model_final.pth in {run_dir}, skipped", flush=True)
            continue
        todo.append(name)
    return todo


def reevaluate_cells(
    cells: Sequence[str],
    study_rows: Dict[str, dict],
    output_dir: str,
    images: int,
    csv_path: str,
    train_command: Sequence[str],
    threads: int = 1,
    device_label: str = "",
) -> List[str]:
    """Evaluate every cell of ``cells`` that finished without diverging (a row of
    ``study_rows``) and has ``output_dir/<cell>/model_final.pth``, unless ``csv_path`` has
    it already, on both splits with ``images`` images each; append a row per cell.
    Returns the cells evaluated now. One process at a time per CSV."""
    done = read_csv_rows(csv_path)
    other_counts = sorted({int(r["images"]) for r in done.values()} - {images})
    if other_counts:
        raise ValueError(
            f"{csv_path} holds evaluations on {other_counts} images, not {images}: "
            "give each image count its own --eval-csv"
        )
    evaluated = []
    for name in todo_cells(cells, study_rows, output_dir, done):
        run_dir = os.path.join(output_dir, name)
        cmd = [*train_command, "--config", os.path.join(run_dir, "config.yaml"),
               "--eval-only", *eval_overrides(run_dir, images)]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        eval_dir = os.path.join(run_dir, f"eval_{images}")
        if os.path.exists(os.path.join(eval_dir, EVAL_RESULTS_FILE)):  # an earlier attempt's
            os.remove(os.path.join(eval_dir, EVAL_RESULTS_FILE))
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        results = read_eval_results(eval_dir) if proc.returncode == 0 else None
        aps = eval_ap(results)
        if aps is None:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            splits = ", ".join(n for n, _ in EVAL_SETS)
            raise RuntimeError(f"{name}: evaluation failed (exit {proc.returncode}; no results for "
                               f"{splits} in {eval_dir}/{EVAL_RESULTS_FILE}):\n{tail}")  # fmt: skip
        row = {"cell": name, "images": images, "wall_clock_s": f"{wall:.1f}", "device": device_label}
        for (_, columns), ap in zip(EVAL_SETS, aps):
            row.update(zip(columns, (ap["ap"], ap["ap50"], ap["ap75"])))
        trained = eval_ap(results, prefix="model/")
        if trained is not None:
            row.update(zip(TRAINED_FIELDS, (ap["ap"] for ap in trained)))
        append_row(csv_path, row, EVAL_FIELDS)
        also = "" if trained is None else (f"; trained weights {row['trained_holdout_ap']}, "
                                           f"{row['trained_box_ap']}")  # fmt: skip
        print(f"{name}, {images} images: held-out AP {row['holdout_ap']}, reported AP {row['box_ap']}"
              f"{also} ({wall:.0f} s)", flush=True)  # fmt: skip
        evaluated.append(name)
    return evaluated
