"""largedet_study.demo_report: the demo's tables in the docs, from demo_speed.csv and
demo_levers.csv, against lines written out by hand from small CSVs."""

import csv
import os

from largedet_study import demo_report

DEMO_FIELDS = ["date", "cpu", "cpu_family_model", "isa", "cores", "precision", "torch", "iterations",
               "training_s", "s_per_step", "box_ap", "label", "config"]  # fmt: skip
LEVER_FIELDS = ["date", "cpu", "cpu_family_model", "isa", "cores", "torch", "lever", "overrides", "round",
                "iters", "demo_s_per_step", "lever_s_per_step", "speedup", "label", "demo"]  # fmt: skip


def _write(path, fields, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(zip(fields, row)))


def test_one_line_per_config_and_class_with_ranges_and_the_target(tmp_path):
    path = tmp_path / "demo_speed.csv"
    cls = ["Xeon", "6/143", "avx2 avx512f", "2", "float32", "2.14.1"]
    _write(path, DEMO_FIELDS, [
        ["2026-11-27", *cls, "898", "290", "0.3229", "61.50", "q", "new.yaml"],
        ["2026-11-28", *cls, "898", "301", "0.3352", "61.50", "q", "new.yaml"],
        ["2026-11-28", *cls, "898", "250", "0.2784", "64.00", "q", "new.yaml SOLVER.MAX_ITER 800"],
        ["2026-11-28", *cls, "898", "280", "0.3118", "59.90", "q", "old.yaml"],
    ])  # fmt: skip
    lines = demo_report.demo_classes_table(str(path)).splitlines()
    assert lines[2:] == [
        "| `new.yaml` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 2 | 290-301 | 0.323-0.335 | 61.5 "
        "| 2026-11-27, 2026-11-28 | no |",  # 301 s is over 300
        "| `new.yaml SOLVER.MAX_ITER 800` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 1 | 250 | 0.278 "
        "| 64.0 | 2026-11-28 | yes |",
        "| `old.yaml` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 1 | 280 | 0.312 | 59.9 | 2026-11-28 | no |",
    ]  # fmt: skip


def test_one_line_per_lever_and_the_demo_it_was_measured_against(tmp_path):
    path = tmp_path / "demo_levers.csv"
    cpu = ["EPYC", "25/1", "avx2", "2", "2.14.1"]
    _write(path, LEVER_FIELDS, [
        ["2026-11-28", *cpu, "w32", "A 1", "1", "60", "0.8000", "0.5000", "1.600", "q", "old.yaml"],
        ["2026-11-28", *cpu, "w32", "A 1", "2", "60", "0.7500", "0.4500", "1.667", "q", "old.yaml"],
        ["2026-11-28", *cpu, "w32", "A 1", "1", "60", "0.4000", "0.4000", "1.000", "q", "new.yaml"],
    ])  # fmt: skip
    lines = demo_report.demo_levers_table(str(path)).splitlines()
    assert lines[2:] == [
        "| `old.yaml` | w32 | `A 1` | EPYC (25/1) | avx2 | 2 | 0.750-0.800 | 0.450-0.500 | 1.60-1.67x | 2026-11-28 |",
        "| `new.yaml` | w32 | `A 1` | EPYC (25/1) | avx2 | 1 | 0.400 | 0.400 | 1.00x | 2026-11-28 |",
    ]  # fmt: skip
