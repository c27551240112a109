"""The demo's training time per machine class in benchmarks/RESULTS.md, generated from
``benchmarks/results/demo_speed.csv`` (rows of ``python benchmarks/demo_speed.py --full``);
registered in :data:`largedet_study.report.BLOCKS` as ``demo-classes``."""

from __future__ import annotations

import csv
import os
from typing import Callable, Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO_CSV = "benchmarks/results/demo_speed.csv"
#: the demo's targets (issue: at most five minutes of training at at least 60 box AP)
TARGET_S, TARGET_AP = 300, 60.0

__all__ = ["BLOCKS", "demo_classes_table"]


def _span(values: List[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def demo_classes_table(path: str = DEMO_CSV) -> str:
    """One line per machine class (CPU, family/model, instruction sets, precision): runs,
    training seconds, seconds per step and box AP (ranges over the runs), dates, and whether
    every run met both targets."""
    with open(os.path.join(ROOT, path), newline="") as f:
        rows = list(csv.DictReader(f))
    groups: Dict[tuple, List[dict]] = {}
    for row in rows:
        key = (row["cpu"], row["cpu_family_model"], row["isa"], row["precision"], row["torch"])
        groups.setdefault(key, []).append(row)
    lines = [
        "| CPU (family/model) | instruction sets | precision | torch | runs | training s "
        "| s/step | box AP | dates | <= 300 s at >= 60 AP |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | :---: |",
    ]
    for (cpu, fm, isa, precision, torch_version), runs in groups.items():
        seconds = [float(r["training_s"]) for r in runs]
        steps = [float(r["s_per_step"]) for r in runs]
        aps = [float(r["box_ap"]) for r in runs if r["box_ap"]]
        met = all(s <= TARGET_S for s in seconds) and len(aps) == len(runs) and min(aps) >= TARGET_AP
        dates = ", ".join(sorted({r["date"] for r in runs}))
        lines.append(
            f"| {cpu} ({fm}) | {isa} | {precision} | {torch_version} | {len(runs)} "
            f"| {_span(seconds, '.0f')} | {_span(steps, '.3f')} "
            f"| {_span(aps, '.1f') if aps else '-'} | {dates} | {'yes' if met else 'no'} |"
        )
    return "\n".join(lines)


BLOCKS: Dict[str, Callable[[], str]] = {"demo-classes": demo_classes_table}
