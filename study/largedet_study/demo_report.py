"""The demo's training time per machine class in benchmarks/RESULTS.md, generated from
``benchmarks/results/demo_speed.csv`` (rows of ``python benchmarks/demo_speed.py --full``);
registered in :data:`largedet_study.report.BLOCKS` as ``demo-classes``."""

from __future__ import annotations

import csv
import os
from typing import Callable, Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO_CSV = "benchmarks/results/demo_speed.csv"
LEVERS_CSV = "benchmarks/results/demo_levers.csv"
#: the demo's targets (issue: at most five minutes of training at at least 60 box AP)
TARGET_S, TARGET_AP = 300, 60.0

__all__ = ["BLOCKS", "TARGET_AP", "TARGET_S", "demo_classes_table", "demo_levers_table", "runs_missing_targets"]


def runs_missing_targets(runs: List[dict]) -> List[dict]:
    """The rows of demo_speed.csv among ``runs`` over ``TARGET_S`` seconds of training, under
    ``TARGET_AP`` box AP, or without an AP."""
    return [r for r in runs if float(r["training_s"]) > TARGET_S or not r["box_ap"] or float(r["box_ap"]) < TARGET_AP]


def _span(values: List[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def _column(runs: List[dict], field: str, fmt: str) -> str:
    """The range of a numeric column over ``runs``."""
    return _span([float(r[field]) for r in runs], fmt)


def _dates(runs: List[dict]) -> str:
    return ", ".join(sorted({r["date"] for r in runs}))


def _groups(path: str, key: tuple) -> Dict[tuple, List[dict]]:
    """The rows of the CSV at ``path`` (relative to the repository), grouped by the values of
    the ``key`` columns, in the order the groups first appear."""
    with open(os.path.join(ROOT, path), newline="") as f:
        rows = list(csv.DictReader(f))
    groups: Dict[tuple, List[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in key), []).append(row)
    return groups


def demo_classes_table(path: str = DEMO_CSV) -> str:
    """One line per demo config and machine class (CPU, family/model, instruction sets,
    precision): runs, training seconds, seconds per step and box AP (ranges over the runs),
    dates, and whether every run met both targets."""
    groups = _groups(path, ("config", "cpu", "cpu_family_model", "isa", "precision", "torch"))
    lines = [
        "| demo config | CPU (family/model) | instruction sets | precision | torch | runs | training s "
        "| s/step | box AP | dates | <= 300 s at >= 60 AP |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | :---: |",
    ]
    for (config, cpu, fm, isa, precision, torch_version), runs in groups.items():
        aps = [float(r["box_ap"]) for r in runs if r["box_ap"]]
        met = not runs_missing_targets(runs)
        lines.append(
            f"| `{config}` | {cpu} ({fm}) | {isa} | {precision} | {torch_version} | {len(runs)} "
            f"| {_column(runs, 'training_s', '.0f')} | {_column(runs, 's_per_step', '.3f')} "
            f"| {_span(aps, '.1f') if aps else '-'} | {_dates(runs)} | {'yes' if met else 'no'} |"
        )
    return "\n".join(lines)


def demo_levers_table(path: str = LEVERS_CSV) -> str:
    """One line per lever, the demo it was measured against and the CPU (rows of
    ``python benchmarks/demo_speed.py --lever ...``): the overrides, rounds, the demo's and the
    lever's seconds per step and the speed-up (ranges over the rounds), dates."""
    groups = _groups(path, ("demo", "lever", "overrides", "cpu", "cpu_family_model", "isa"))
    lines = [
        "| measured against | lever | overrides | CPU (family/model) | instruction sets | rounds "
        "| demo s/step | lever s/step | speed-up | dates |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for (demo, lever, overrides, cpu, fm, isa), runs in groups.items():
        lines.append(
            f"| `{demo}` | {lever} | `{overrides}` | {cpu} ({fm}) | {isa} | {len(runs)} "
            f"| {_column(runs, 'demo_s_per_step', '.3f')} | {_column(runs, 'lever_s_per_step', '.3f')} "
            f"| {_column(runs, 'speedup', '.2f')}x | {_dates(runs)} |"
        )
    return "\n".join(lines)


BLOCKS: Dict[str, Callable[[], str]] = {"demo-classes": demo_classes_table, "demo-levers": demo_levers_table}
