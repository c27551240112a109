"""The video benchmarks' CSV rows (projects/video/benchmarks/multigrid.py, demo_runs.py; on the
import path by pytest.ini's pythonpath) as the study's report turns them into the video README's
tables (largedet_study.video_bench_report): the two projects meet here, in neither's tests."""

import csv
import json
import types

import demo_runs
import multigrid as multigrid_benchmark
import pytest
from largedet_study import video_bench_report


def _write(path, fields, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        writer.writerows(rows)


def test_multigrid_demo_rows_pair_within_an_invocation(tmp_path, monkeypatch):
    """projects/video/benchmarks/multigrid.py --csv writes a row per run; the README's table
    takes each multigrid run's speed-up and top-1 difference against the base run of the same
    invocation, never another's, and says whether every run met >= 2.5x within 1 point."""
    bench = multigrid_benchmark
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


def test_video_demo_runs_read_the_run_and_make_one_line_per_config(tmp_path):
    """projects/video/benchmarks/demo_runs.py reads a finished run (training = wall clock less
    evaluation over the invocations; top-1 with or without the set's name in front) and
    refuses an unfinished one; the README's table gives ranges over the runs."""
    run = tmp_path / "run"
    run.mkdir()
    summary = {"status": "finished", "iterations": 300, "invocations": [
        {"wall_clock_s": 100.0, "evaluation_s": 0.0}, {"wall_clock_s": 60.0, "evaluation_s": 30.0}]}
    (run / "run_summary.json").write_text(json.dumps(summary))
    (run / "metrics.json").write_text("\n".join(json.dumps(r) for r in [
        {"iteration": 10, "total_loss": 1.0}, {"iteration": 299, "classification/top1": 98.0}]))
    assert demo_runs.run_summary_figures(str(run)) == {"iterations": 300, "training_s": 130.0, "top1": 98.0}
    (run / "run_summary.json").write_text(json.dumps({**summary, "status": "preempted"}))
    with pytest.raises(RuntimeError, match="did not finish"):
        demo_runs.run_summary_figures(str(run))

    path = tmp_path / "demo_runs.csv"
    cls = ["2026-11-28", "EPYC", "25/1", "avx2", "2", "2.14.1", "a cell"]
    _write(path, demo_runs.CSV_FIELDS, [
        cls + ["projects/video/configs/tsm.yaml", "1", "300", "120.0", "0.4000", "157.0", "100.00"],
        cls + ["projects/video/configs/tsn.yaml", "1", "300", "122.0", "0.4067", "166.0", "19.00"],
        cls + ["projects/video/configs/tsm.yaml", "2", "300", "130.0", "0.4333", "160.0", "98.00"],
    ])  # fmt: skip
    assert video_bench_report.video_demo_table(str(path)).splitlines()[2:] == [
        "| `tsm.yaml` | EPYC (25/1) | avx2 | 2.14.1 | a cell | 2 | 98.0-100.0 | 120-130 | 0.400-0.433 | 157-160 | 2026-11-28 |",
        "| `tsn.yaml` | EPYC (25/1) | avx2 | 2.14.1 | a cell | 1 | 19.0 | 122 | 0.407 | 166 | 2026-11-28 |",
    ]  # fmt: skip
