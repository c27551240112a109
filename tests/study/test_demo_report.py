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


def _multigrid_benchmark():
    import importlib.util

    path = os.path.join(demo_report.ROOT, "projects", "video", "benchmarks", "multigrid.py")
    spec = importlib.util.spec_from_file_location("multigrid_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multigrid_demo_rows_pair_within_an_invocation(tmp_path, monkeypatch):
    """projects/video/benchmarks/multigrid.py --csv writes a row per run; the README's table
    takes each multigrid run's speed-up and top-1 difference against the base run of the same
    invocation, never another's, and says whether every run met >= 2.5x within 1 point."""
    import types

    from largedet_study import video_bench_report

    bench = _multigrid_benchmark()
    monkeypatch.setattr(bench, "cpu_class", lambda: dict(cpu="EPYC", cpu_family_model="25/1", isa="avx2", cores="2"))
    path = str(tmp_path / "mg.csv")
    args = types.SimpleNamespace(load="a cell", config_file=bench.DEFAULT_CONFIG, opts=[], data="frames")

    def result(steps, train_s, top1, epochs=16):
        return dict(epochs=epochs, steps=steps, train_s=train_s, s_per_step=train_s / steps, test_s=30.0,
                    top1=top1, load="2.0 -> 2.1")  # fmt: skip

    bench.append_row(path, "i1", result(800, 300.0, 100.0), "", args)
    bench.append_row(path, "i1", result(230, 100.0, 99.0, 24), "1.5", args)  # 3.00x, -1.0
    bench.append_row(path, "i2", result(800, 240.0, 99.0), "", args)
    bench.append_row(path, "i2", result(230, 120.0, 99.0, 24), "1.5", args)  # 2.00x, +0.0
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [r["schedule"] for r in rows] == ["base", "multigrid", "base", "multigrid"]
    assert rows[0]["config"] == "projects/video/configs/tsm_r18w32_8f_moving_shapes_adamw_steps_bs16.yaml"
    lines = video_bench_report.multigrid_demo_table(path).splitlines()
    torch_version = rows[0]["torch"]
    date = rows[0]["date"]
    assert lines[2:] == [
        f"| EPYC (25/1) | {torch_version} | a cell | base shape | 2 | 16 | 800 | 240-300 | 99.0-100.0 | - | - | - | {date} |",
        f"| EPYC (25/1) | {torch_version} | a cell | multigrid, 1.5x epochs | 2 | 24 | 230 | 100-120 | 99.0 "
        f"| 3.00x, 2.00x | -1.0, +0.0 | no | {date} |",
    ]  # fmt: skip
    assert video_bench_report.multigrid_demo_table(str(tmp_path / "none.csv")) == "(not measured yet)"


def test_gpu_multigrid_line_reads_the_benchmarks_table_and_speed_lines(tmp_path):
    from largedet_study import video_bench_report

    log = tmp_path / "tail.log"
    log.write_text("\n".join([
        "[11/26 12:53:14 largedet_video]: multigrid, 1x epochs: {'epochs': 16}",
        "| schedule               |   epochs |   steps |   training s |   s/step |   top-1 % |   test s | load avg   |",
        "|:-----------------------|---------:|--------:|-------------:|---------:|----------:|---------:|:-----------|",
        "| base shape             |       16 |     800 |           17 |    0.021 |       100 |        1 | 1.6 -> 2.3 |",
        "| multigrid, 1.5x epochs |       24 |     230 |           12 |    0.053 |        97 |        1 | 2.3 -> 2.3 |",
        "multigrid, 1.5x epochs: 1.39x faster training (3.48x fewer steps), top-1 -3.0 points against the base",
    ]))  # fmt: skip
    assert video_bench_report.gpu_multigrid_line(str(log)) == (
        f"the base shape trains 800 steps in 17 s to 100%; multigrid at 1.5x the epochs 1.39x faster to 97% (`{log}`)")
