"""The demo's training time per machine class in benchmarks/RESULTS.md, generated from
``benchmarks/results/demo_speed.csv`` (rows of ``python benchmarks/demo_speed.py --full``);
registered in :data:`largedet_study.report.BLOCKS` as ``demo-classes``."""

from __future__ import annotations

from typing import Callable, Dict, List

from .tables import column_span, csv_groups, markdown_table, run_dates, span
DEMO_CSV = "benchmarks/results/demo_speed.csv"
LEVERS_CSV = "benchmarks/results/demo_levers.csv"
#: the demo's targets, at most five minutes of training at at least 60 box AP: those of
#: benchmarks/demo_speed.py, the benchmark that checks them (tests/benchmarks/test_demo_speed.py
#: holds the two equal; neither project imports the other)
TARGET_S, TARGET_AP = 300, 60.0

__all__ = ["BLOCKS", "TARGET_AP", "TARGET_S", "demo_classes_table", "demo_levers_table", "runs_missing_targets"]


def runs_missing_targets(runs: List[dict]) -> List[dict]:
    """The rows of demo_speed.csv among ``runs`` over ``TARGET_S`` seconds of training, under
    ``TARGET_AP`` box AP, or without an AP."""
    return [r for r in runs if float(r["training_s"]) > TARGET_S or not r["box_ap"] or float(r["box_ap"]) < TARGET_AP]


def demo_classes_table(path: str = DEMO_CSV) -> str:
    """One line per demo config and machine class (CPU, family/model, instruction sets,
    precision): runs, training seconds, seconds per step and box AP (ranges over the runs),
    dates, and whether every run met both targets."""
    groups = csv_groups(path, ("config", "cpu", "cpu_family_model", "isa", "precision", "torch"))
    rows = []
    for (config, cpu, fm, isa, precision, torch_version), runs in groups.items():
        aps = [float(r["box_ap"]) for r in runs if r["box_ap"]]
        met = not runs_missing_targets(runs)
        rows.append([
            f"`{config}`", f"{cpu} ({fm})", isa, precision, torch_version, len(runs),
            column_span(runs, "training_s", ".0f"), column_span(runs, "s_per_step", ".3f"),
            span(aps, ".1f") if aps else "-", run_dates(runs), "yes" if met else "no",
        ])  # fmt: skip
    return markdown_table(
        ["demo config", "CPU (family/model)", "instruction sets", "precision", "torch", "runs",
         "training s", "s/step", "box AP", "dates", "<= 300 s at >= 60 AP"],
        "lllllrrrrlc", rows,
    )  # fmt: skip


def demo_levers_table(path: str = LEVERS_CSV) -> str:
    """One line per lever, the demo it was measured against and the CPU (rows of
    ``python benchmarks/demo_speed.py --lever ...``): the overrides, rounds, the demo's and the
    lever's seconds per step and the speed-up (ranges over the rounds), dates."""
    groups = csv_groups(path, ("demo", "lever", "overrides", "cpu", "cpu_family_model", "isa"))
    rows = [
        [f"`{demo}`", lever, f"`{overrides}`", f"{cpu} ({fm})", isa, len(runs),
         column_span(runs, "demo_s_per_step", ".3f"), column_span(runs, "lever_s_per_step", ".3f"),
         column_span(runs, "speedup", ".2f") + "x", run_dates(runs)]
        for (demo, lever, overrides, cpu, fm, isa), runs in groups.items()
    ]  # fmt: skip
    return markdown_table(
        ["measured against", "lever", "overrides", "CPU (family/model)", "instruction sets", "rounds",
         "demo s/step", "lever s/step", "speed-up", "dates"],
        "lllllrrrrl", rows,
    )  # fmt: skip


BLOCKS: Dict[str, Callable[[], str]] = {"demo-classes": demo_classes_table, "demo-levers": demo_levers_table}
