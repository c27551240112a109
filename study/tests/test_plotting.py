"""largedet_study.plotting, study/plot_study.py and tools/plot_metrics.py (largedet.utils.run_curves):
study CSV and metrics.json to figures."""

import json
import os
import subprocess
import sys

import pytest

from largedet_study.plotting import load_run, load_study, study_table
from study_csv import write_csv

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIELDS = [
    "cell",
    "optimizer",
    "batch",
    "lr",
    "images_per_s",
    "box_ap",
    "ap50",
    "ap75",
    "diverged",
    "agvm",
    "pmd_period",
]


def write_study(path, rows):
    write_csv(path, FIELDS, rows)


STUDY = [
    {"cell": "sgd-bs16", "optimizer": "sgd", "batch": 16, "box_ap": "50.25", "diverged": "no", "images_per_s": "100", "agvm": "no"},
    {"cell": "sgd-bs1024", "optimizer": "sgd", "batch": 1024, "box_ap": "", "diverged": "yes", "images_per_s": "120", "agvm": "no"},
    {"cell": "pmd_lamb-bs16", "optimizer": "pmd_lamb", "batch": 16, "box_ap": "48.0", "diverged": "no", "images_per_s": "99", "agvm": "no"},
    {"cell": "pmd_lamb-bs1024", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "30.04", "diverged": "no", "images_per_s": "118", "agvm": "no"},
    {"cell": "pmd_lamb-bs1024-T3-cosine", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "99", "diverged": "no", "agvm": "no", "pmd_period": "3"},
    {"cell": "pmd_lamb-bs1024-agvm", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "31.0", "diverged": "no", "agvm": "yes"},
]  # fmt: skip


def test_study_table_is_the_main_grid_only(tmp_path):
    path = str(tmp_path / "study.csv")
    write_study(path, STUDY)
    rows = load_study(path)
    assert rows[0]["batch"] == 16 and rows[0]["box_ap"] == 50.25 and rows[1]["box_ap"] is None
    assert study_table(rows).splitlines() == [
        "| optimizer | batch 16 | batch 1024 |",
        "| --- | ---: | ---: |",
        # the sweep (99) and AGVM (31.0) cells are not in it; halves round up: 50.25 -> 50.3
        "| sgd | 50.3 | div. |",
        "| pmd_lamb | 48.0 | 30.0 |",
    ]


def test_study_table_averages_a_cells_seeds(tmp_path):
    from largedet_study.plotting import mean_ap, seed_replicas

    seeded = STUDY + [
        {"cell": "sgd-bs16-s1", "optimizer": "sgd", "batch": 16, "box_ap": "50.3", "diverged": "no", "agvm": "no"},
        {"cell": "sgd-bs1024-s1", "optimizer": "sgd", "batch": 1024, "box_ap": "", "diverged": "yes", "agvm": "no"},
        {"cell": "pmd_lamb-bs16-s3", "optimizer": "pmd_lamb", "batch": 16, "box_ap": "48.1", "diverged": "no", "agvm": "no"},
        {"cell": "pmd_lamb-bs1024-s1", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "", "diverged": "yes", "agvm": "no"},
        # a sweep's own seed is not a seed of the main cell
        {"cell": "pmd_lamb-bs1024-T3-cosine-s1", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "1", "diverged": "no", "agvm": "no"},
    ]  # fmt: skip
    path = str(tmp_path / "study.csv")
    write_study(path, seeded)
    rows = load_study(path)
    assert [r["cell"] for r in seed_replicas(rows, "pmd_lamb-bs1024")] == ["pmd_lamb-bs1024", "pmd_lamb-bs1024-s1"]
    # asked for by one of its seeds' names: the same replicas
    assert seed_replicas(rows, "pmd_lamb-bs1024-s1") == seed_replicas(rows, "pmd_lamb-bs1024")
    assert mean_ap(seed_replicas(rows, "pmd_lamb-bs1024")) == 30.04  # the diverged seed has no AP
    assert study_table(rows).splitlines()[2:] == [
        "| sgd | 50.3 (2 seeds) | div. (2 seeds) |",  # (50.25 + 50.3) / 2 = 50.275
        "| pmd_lamb | 48.1 (2 seeds) | 30.0, div. 1/2 |",  # 48.05 rounds up in decimal
    ]


def test_one_decimal_rounds_the_csv_values_as_written():
    from largedet_study.plotting import one_decimal

    # 75.35 is 75.3499... in binary, which plain formatting rounds down
    assert f"{75.35:.1f}" == "75.3" and one_decimal(75.35) == "75.4"
    assert [one_decimal(x) for x in (73.54, 67.5, 0.04, 99.95)] == ["73.5", "67.5", "0.0", "100.0"]


def test_bad_study_csv_names_the_file_and_column(tmp_path):
    path = str(tmp_path / "bad.csv")
    write_study(path, [dict(STUDY[0], batch="sixteen")])
    with pytest.raises(ValueError, match=r"bad.csv, line 2: column 'batch'"):
        load_study(path)
    with open(path, "w") as f:
        f.write("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a study CSV"):
        load_study(path)


def fake_run_dir(run_dir, batch, num_train, iterations):
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(
            f"MODEL:\n  DEVICE: cpu\nSOLVER:\n  BASE_LR: 0.1\n  IMS_PER_BATCH: {batch}\nTEST:\n  IMS_PER_BATCH: 99\n"
        )
    with open(os.path.join(run_dir, "run_summary.json"), "w") as f:  # the parts read
        json.dump({"batch": {"global_batch": batch}, "dataset_size": num_train}, f)
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for it in iterations:
            f.write(
                json.dumps(
                    {"iteration": it, "total_loss": 1.0 / (it + 1), "lr": 0.01, "agvm/mu/rpn": 1.1}
                )
                + "\n"
            )
        f.write('{"iteration": 9, "total_lo')  # cut short by a crash


def test_load_run_puts_runs_on_an_epoch_axis(tmp_path):
    # iterations 4 and 5 logged twice (a resumed run): the later record wins, once
    fake_run_dir(str(tmp_path / "a"), 64, 1500, [0, 4, 5, 4, 5, 9])
    run = load_run(str(tmp_path / "a"))
    assert run.global_batch == 64 and run.num_train == 1500  # not TEST.IMS_PER_BATCH
    assert run.iterations == [0, 4, 5, 9]
    assert run.epochs(run.iterations) == pytest.approx(
        [64 / 1500, 320 / 1500, 384 / 1500, 640 / 1500]
    )
    assert run.scalars["agvm/mu/rpn"][0] == (0, 1.1)
    assert load_run(str(tmp_path / "a"), num_train=640).epochs([9]) == [1.0]


def test_plot_metrics_cli_writes_figures_and_the_table(tmp_path):
    study = str(tmp_path / "study.csv")
    write_study(study, STUDY)
    fake_run_dir(str(tmp_path / "a"), 16, 1536, range(0, 96, 5))
    fake_run_dir(str(tmp_path / "b"), 256, 1536, range(0, 6))
    out = tmp_path / "figs"
    study_cmd = [sys.executable, os.path.join(ROOT, "study", "plot_study.py"), "--study", study, "--out-dir", str(out)]
    proc = subprocess.run(study_cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| pmd_lamb | 48.0 | 30.0 |" in proc.stdout
    cmd = [sys.executable, os.path.join(ROOT, "tools", "plot_metrics.py"),
           "--runs", str(tmp_path / "a"), str(tmp_path / "b"), "--out-dir", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("ap_vs_batch.png", "images_per_s.png", "loss_lr_vs_epochs.png"):
        with open(out / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # errors name the problem, exit 2
    proc = subprocess.run(
        cmd[:2] + ["--runs", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "no metrics.json in" in proc.stderr


def test_cells_at_batch_orders_by_the_held_out_split(tmp_path):
    from largedet_study.plotting import plot_cells_at_batch

    fields = FIELDS + ["holdout_ap"]
    rows = [
        {"cell": "sgd-bs16", "optimizer": "sgd", "batch": 16, "box_ap": "75.0", "holdout_ap": "72.0", "diverged": "no"},
        {"cell": "sgd-bs1024", "optimizer": "sgd", "batch": 1024, "box_ap": "", "holdout_ap": "", "diverged": "yes"},
        {"cell": "pmd_lamb-bs1024", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "72.1", "holdout_ap": "71.7", "diverged": "no"},
        # better on the reported split, worse on the held-out one: held-out decides
        {"cell": "pmd_lamb-bs1024-lrx2", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "74.0", "holdout_ap": "70.0", "diverged": "no"},
        {"cell": "pmd_lamb-bs1024-ep1.4x", "optimizer": "pmd_lamb", "batch": 1024, "box_ap": "73.5", "holdout_ap": "72.3", "diverged": "no"},
    ]  # fmt: skip
    path = str(tmp_path / "study.csv")
    write_csv(path, fields, rows)
    png = str(tmp_path / "cells.png")
    order = plot_cells_at_batch(load_study(path), 1024, png)
    assert order == [
        ("pmd_lamb-bs1024-ep1.4x", 72.3, 73.5),
        ("pmd_lamb-bs1024", 71.7, 72.1),
        ("pmd_lamb-bs1024-lrx2", 70.0, 74.0),
        ("sgd-bs1024", None, None),
    ]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no cell at batch 64"):
        plot_cells_at_batch(load_study(path), 64, png)

    # a larger evaluation replaces the study's own figures on both splits; a cell it lacks
    # is left out (not shown with the smaller splits' figures), a diverged one stays
    from largedet_study.plotting import with_reevaluation

    larger = tmp_path / "eval.csv"
    larger.write_text("cell,images,holdout_ap,box_ap\npmd_lamb-bs1024,2000,72.9,73.0\n"
                      "sgd-bs16,2000,74.0,75.5\npmd_lamb-bs1024-ep1.4x,2000,72.5,74.0\n")  # fmt: skip
    merged, images = with_reevaluation(load_study(path), str(larger))
    assert images == 2000
    assert [(r["cell"], r["holdout_ap"], r["box_ap"]) for r in merged] == [
        ("sgd-bs16", 74.0, 75.5), ("sgd-bs1024", None, None), ("pmd_lamb-bs1024", 72.9, 73.0),
        ("pmd_lamb-bs1024-ep1.4x", 72.5, 74.0)]  # fmt: skip
    assert [c for c, _, _ in plot_cells_at_batch(merged, 1024, png, images=images)] == [
        "pmd_lamb-bs1024", "pmd_lamb-bs1024-ep1.4x", "sgd-bs1024"]  # fmt: skip
    cli = [sys.executable, os.path.join(ROOT, "study", "plot_study.py"), "--study", path,
           "--eval-csv", str(larger), "--cells-at-batch", "1024", "--out-dir", str(tmp_path / "f")]  # fmt: skip
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| sgd | 75.5 | div. |" in proc.stdout and "| pmd_lamb | - | 73.0 |" in proc.stdout
    larger.write_text("cell,images,holdout_ap,box_ap\n")
    with pytest.raises(ValueError, match="no evaluations in it yet"):
        with_reevaluation(load_study(path), str(larger))
    larger.write_text("cell,images,holdout_ap,box_ap\na,150,1,1\nb,2000,2,2\n")
    with pytest.raises(ValueError, match=r"different image counts \[150, 2000\]"):
        with_reevaluation(load_study(path), str(larger))
    proc = subprocess.run(cli[:2] + cli[4:6] + ["--compare", "a=x.csv"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--eval-csv goes with --study" in proc.stderr


def _curve_rows():
    row = {"optimizer": "pmd_lamb", "diverged": "no"}
    return [
        {**row, "cell": "sgd-bs16-wu2", "optimizer": "sgd", "batch": 16, "holdout_ap": 74.0, "box_ap": 75.0},
        {**row, "cell": "sgd-bs16-wu2-s1", "optimizer": "sgd", "batch": 16, "holdout_ap": 74.2, "box_ap": 74.6},
        {**row, "cell": "pmd_lamb-bs1024", "batch": 1024, "holdout_ap": 71.0, "box_ap": 72.0},
        {**row, "cell": "pmd_lamb-bs1024-s1", "batch": 1024, "holdout_ap": 71.4, "box_ap": 72.2},
        {**row, "cell": "pmd_lamb-bs1024-ep1.4x", "batch": 1024, "holdout_ap": 72.5, "box_ap": 73.5},
        {**row, "cell": "pmd_lamb-bs1024-ep2x", "batch": 1024, "holdout_ap": 73.5, "box_ap": 74.1},
        {**row, "cell": "pmd_lamb-bs1024-ep1.4x-wd0.01", "batch": 1024, "holdout_ap": 90.0, "box_ap": 90.0},
        {**row, "cell": "pmd_lamb-bs256", "batch": 256, "holdout_ap": 74.2, "box_ap": 75.5},
        {**row, "cell": "pmd_lamb-bs1024-ep1.7x", "batch": 1024, "holdout_ap": None, "box_ap": None,
         "diverged": "yes"},
    ]  # fmt: skip


def test_epoch_curve_keeps_the_batch_and_epoch_cells_only_and_brackets_parity(tmp_path):
    from largedet_study.plotting import epoch_curve, parity_bracket, plot_ap_vs_epochs

    points, baseline = epoch_curve(_curve_rows())
    assert baseline == [(74.0, 75.0), (74.2, 74.6)]
    assert [(p.batch, p.factor, p.seeds) for p in points] == [(256, 1.0, 1), (1024, 1.0, 2), (1024, 1.4, 1), (1024, 2.0, 1)]
    assert points[1].reported == pytest.approx(72.1) and points[1].holdout == pytest.approx(71.2)
    # the baseline's mean 74.8: within 1 AP from 73.8 on; 1.4x (73.5) is not, 2.0x (74.1) is
    assert parity_bracket(points, 74.8, 1024) == (1.4, 2.0)
    assert parity_bracket(points, 74.8, 256) == (None, 1.0)
    assert parity_bracket(points, 80.0, 1024) == (2.0, None)
    assert parity_bracket(points, 73.4, 1024, key="holdout") == (1.0, 1.4)  # from 72.4 on
    path = plot_ap_vs_epochs(_curve_rows(), str(tmp_path / "epochs.png"))
    assert os.path.getsize(path) > 10_000


def test_epoch_curve_draws_a_second_recipe_apart_and_brackets_its_parity(tmp_path):
    from largedet_study.plotting import epoch_curve, parity_bracket, plot_ap_vs_epochs

    row = {"optimizer": "pmd_lamb", "diverged": "no", "batch": 1024}
    tuned = [
        {**row, "cell": "pmd_lamb-bs1024-lrwsd-wd0.01", "holdout_ap": 72.0, "box_ap": 73.0},
        {**row, "cell": "pmd_lamb-bs1024-lrwsd-wd0.01-s1", "holdout_ap": 72.4, "box_ap": 73.4},
        {**row, "cell": "pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01", "holdout_ap": 73.4, "box_ap": 74.0},
        # another recipe's cell at 1.4x (the suffix is not the tuned recipe's): left out
        {**row, "cell": "pmd_lamb-bs1024-ep1.4x-lrwsd", "holdout_ap": 99.0, "box_ap": 99.0},
    ]
    points, _ = epoch_curve(_curve_rows() + tuned)
    mine = [(p.factor, p.seeds, p.holdout, p.reported) for p in points if p.recipe == "-lrwsd-wd0.01"]
    assert mine == [(1.0, 2, pytest.approx(72.2), pytest.approx(73.2)), (1.4, 1, 73.4, 74.0)]
    # the study's recipe is unchanged by the tuned cells
    assert [(p.factor, p.seeds) for p in points if p.batch == 1024 and p.recipe == ""] == [(1.0, 2), (1.4, 1), (2.0, 1)]
    # baseline 74.8: the tuned recipe is within 1 AP at 1.4x (74.0), the study's only at 2x
    assert parity_bracket(points, 74.8, 1024, recipe="-lrwsd-wd0.01") == (1.0, 1.4)
    assert parity_bracket(points, 74.8, 1024) == (1.4, 2.0)
    # only the study's recipe when asked
    assert {p.recipe for p in epoch_curve(_curve_rows() + tuned, recipes=("",))[0]} == {""}
    path = plot_ap_vs_epochs(_curve_rows() + tuned, str(tmp_path / "epochs.png"))
    assert os.path.getsize(path) > 10_000


def test_regime_gaps_subtract_each_grids_own_baseline(tmp_path):
    from largedet_study.plotting import plot_regimes, regime_gaps, regime_table

    row = {"optimizer": "pmd_lamb", "diverged": "no"}
    small = [  # 1536 images, 200 epochs: the baseline sgd-bs16-wu2
        {**row, "cell": "sgd-bs16-wu2", "optimizer": "sgd", "batch": 16, "iterations": 19200, "epochs": "200", "holdout_ap": 74.0, "box_ap": 75.0},
        {**row, "cell": "pmd_lamb-bs1024", "batch": 1024, "iterations": 300, "epochs": "200", "holdout_ap": 71.0, "box_ap": 72.5},
        {**row, "cell": "pmd_lamb-bs1024-ep1.4x", "batch": 1024, "iterations": 420, "epochs": "280", "holdout_ap": 72.5, "box_ap": 73.5},
    ]
    large = [  # 24,576 images, 12 epochs: the baseline sgd-bs16-wu0.65, two seeds
        {**row, "cell": "sgd-bs16-wu0.65", "optimizer": "sgd", "batch": 16, "iterations": 18432, "epochs": "12", "holdout_ap": 70.0, "box_ap": 71.0},
        {**row, "cell": "sgd-bs16-wu0.65-s1", "optimizer": "sgd", "batch": 16, "iterations": 18432, "epochs": "12", "holdout_ap": 71.0, "box_ap": 72.0},
        {**row, "cell": "pmd_lamb-bs256-lrwsd-wd0.01", "batch": 256, "iterations": 1152, "epochs": "12", "holdout_ap": 70.0, "box_ap": 71.0},
        {**row, "cell": "pmd_lamb-bs256-lrwsd-wd0.01-s1", "batch": 256, "iterations": 1152, "epochs": "12", "holdout_ap": 70.4, "box_ap": 71.2},
        {**row, "cell": "pmd_lamb-bs256-ep1.4x", "batch": 256, "iterations": 1613, "epochs": "16.8", "holdout_ap": 71.0, "box_ap": 72.0},
    ]  # fmt: skip
    gaps = regime_gaps([("small", small), ("large", large)])
    got = [(g.regime, g.batch, round(g.fraction, 4), g.recipe, g.factor, g.seeds) for g in gaps]
    assert got == [("small", 1024, 0.6667, "", 1.0, 1), ("small", 1024, 0.6667, "", 1.4, 1),
                   ("large", 256, 0.0104, "", 1.4, 1), ("large", 256, 0.0104, "-lrwsd-wd0.01", 1.0, 2)]  # fmt: skip
    assert (gaps[0].holdout_gap, gaps[0].reported_gap) == (-3.0, -2.5)
    # the large grid's baseline is the mean of its two seeds: 70.5 / 71.5
    assert gaps[3].holdout_gap == pytest.approx(-0.3) and gaps[3].reported_gap == pytest.approx(-0.4)
    assert gaps[2].holdout_gap == pytest.approx(0.5) and gaps[2].reported_gap == pytest.approx(0.5)
    table = regime_table(gaps)
    assert "| large | 256 (1%) | WSD LR, weight decay 0.01 | 1x | 2 | -0.30 | -0.40 |" in table
    assert "| small | 1024 (67%) | step LR, wd 1e-4 | 1.4x | 1 | -1.50 | -1.50 |" in table
    path = plot_regimes([("small", small), ("large", large)], str(tmp_path / "gap.png"))
    assert os.path.getsize(path) > 10_000


def _recorded(monkeypatch, method):
    """The keyword arguments of every call of matplotlib's ``Axes.<method>``."""
    import matplotlib.axes

    calls, original = [], getattr(matplotlib.axes.Axes, method)

    def record(self, *args, **kwargs):
        calls.append((args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, method, record)
    return calls


def test_a_one_point_run_draws_a_dot_in_the_loss_plot(tmp_path, monkeypatch):
    from largedet_study.plotting import RunCurves, plot_curves

    calls = _recorded(monkeypatch, "plot")
    run = RunCurves("one", global_batch=8, num_train=80, iterations=[0], loss=[1.5], lr=[0.01])
    assert os.path.isfile(plot_curves([run], str(tmp_path / "curves.png")))
    assert [kwargs.get("marker") for _, kwargs in calls] == ["o", "o"]  # loss, LR
    calls.clear()
    run = RunCurves("two", global_batch=8, num_train=80, iterations=[0, 1], loss=[1.5, 1.2], lr=[0.01, 0.01])
    plot_curves([run], str(tmp_path / "curves2.png"))
    assert [kwargs.get("marker") for _, kwargs in calls] == [None, None]  # lines as before


def test_the_throughput_chart_says_what_red_means(tmp_path, monkeypatch):
    from largedet_study.plotting import plot_throughput

    calls = _recorded(monkeypatch, "legend")
    rows = [{"cell": "sgd-bs16", "batch": 16, "images_per_s": 10.0, "diverged": "no"},
            {"cell": "sgd-bs1024", "batch": 1024, "images_per_s": 12.0, "diverged": "yes"}]  # fmt: skip
    plot_throughput(rows, str(tmp_path / "throughput.png"))
    (_, kwargs), = calls
    assert {h.get_label(): h.get_facecolor() for h in kwargs["handles"]}.keys() == {"trained", "diverged"}
    red = [h for h in kwargs["handles"] if h.get_label() == "diverged"][0]
    import matplotlib.colors

    assert matplotlib.colors.to_hex(red.get_facecolor()) == matplotlib.colors.to_hex("tab:red")


def test_epoch_curve_takes_the_strongest_batch16_baseline():
    from largedet_study.plotting import epoch_curve

    def row(cell, h, r):
        return {"cell": cell, "holdout_ap": h, "box_ap": r, "diverged": "no", "batch": 16}

    rows = [row("sgd-bs16-wu0.65", 80.0, 81.0), row("sgd-bs16-wu0.65-s1", 80.2, 81.2),
            row("sgd-bs16-wu0.65-s2", 80.4, 81.4),
            row("sgd-bs16-wu0.65-lrwsd", 81.0, 82.0), row("sgd-bs16-wu0.65-lrwsd-s1", 81.2, 82.2)]
    # the better held-out mean wins, whatever its seeds (the strongest reference so far)
    assert epoch_curve(rows)[1] == [(81.0, 82.0), (81.2, 82.2)]
    rows.append(row("sgd-bs16-wu0.65-lrx2-lrwsd", 80.1, 85.0))  # best reported, not held-out
    assert epoch_curve(rows)[1] == [(81.0, 82.0), (81.2, 82.2)]
