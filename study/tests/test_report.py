"""largedet_study.report: the docs' generated numbers against their CSVs.

The repository check (:func:`test_docs_match_their_csvs`) is what fails when a table, a
cited number or a config comment's measured line differs from what its CSV gives."""

import csv
import os

import pytest

from largedet_study import report
from study_csv import write_csv

FIELDS = ["cell", "batch", "iterations", "box_ap", "holdout_ap", "diverged", "final_loss", "device"]


def _write(path, rows):
    write_csv(path, FIELDS, rows)


def _row(cell, batch, holdout, reported, device="2-core AMD EPYC VM"):
    return dict(cell=cell, batch=batch, iterations=100, box_ap=reported, holdout_ap=holdout,
                diverged="no", final_loss="0.2", device=device)


@pytest.fixture
def fake_regime(tmp_path, monkeypatch):
    """A regime CSV of two batch-16 recipes and two large-batch ones, in a temporary root."""
    os.makedirs(tmp_path / "r")
    rows = [
        _row("sgd-bs16-wu0.65", 16, "82.0", "83.0"),
        _row("sgd-bs16-wu0.65-s1", 16, "82.4", "83.2"),
        _row("sgd-bs16-wu0.65-s2", 16, "82.2", "83.4"),
        _row("sgd-bs16-wu0.65-lrwsd", 16, "82.6", "83.6"),
        _row("sgd-bs16-wu0.65-lrwsd-s1", 16, "82.8", "83.8"),
        _row("sgd-bs16-wu0.65-lrwsd-s2", 16, "82.7", "83.7"),
        _row("pmd_lamb-bs256-lrwsd-wd0.01", 256, "82.5", "83.5"),
        _row("pmd_lamb-bs256-lrwsd-wd0.01-s1", 256, "82.6", "83.6"),
        _row("pmd_lamb-bs256-lrwsd-wd0.01-s2", 256, "82.4", "83.4"),
        _row("pmd_lamb-bs256-ep2x-lrwsd-wd0.01", 256, "90.0", "90.0"),
        _row("pmd_lamb-bs256-ep2x-lrwsd-wd0.01-s1", 256, "90.0", "90.0"),
        _row("pmd_lamb-bs256-ep2x-lrwsd-wd0.01-s2", 256, "90.0", "90.0"),
        dict(cell="sgd-bs256", batch=256, iterations=42, diverged="yes", final_loss="1.4"),
    ]
    _write(tmp_path / "r" / "regime.csv", rows)
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "regime": "r/regime.csv",
                                         "regime_epyc": "r/none.csv"})
    return tmp_path


def test_families_group_seeds_and_skip_diverged(fake_regime):
    fams = report.families("regime")
    assert len(fams["sgd-bs16-wu0.65"].rows) == 3
    assert fams["sgd-bs256"].trained == ()
    assert fams["pmd_lamb-bs256-lrwsd-wd0.01"].summary("box_ap").mean == pytest.approx(83.5)


def test_the_strongest_baseline_is_chosen_on_held_out(fake_regime):
    assert report.regime_baseline().name == "sgd-bs16-wu0.65-lrwsd"


def test_a_one_seed_batch16_recipe_above_the_rest_becomes_the_baseline_and_leaves_no_verdict(fake_regime):
    rows = list(csv.DictReader(open(fake_regime / "r" / "regime.csv")))
    rows.append(_row("sgd-bs16-wu0.65-lrx2-lrwsd", 16, "83.5", "84.0"))
    _write(fake_regime / "r" / "regime.csv", rows)
    assert report.regime_baseline().name == "sgd-bs16-wu0.65-lrx2-lrwsd"
    verdict = report.regime_verdict()
    assert not report.regime_goal()
    assert "**no verdict yet**: missing 2 more seed(s) of `sgd-bs16-wu0.65-lrx2-lrwsd` on EPYC" in verdict
    # its second and third seeds: a verdict, not met (-1.0 held-out)
    rows += [_row("sgd-bs16-wu0.65-lrx2-lrwsd-s1", 16, "83.4", "84.1"),
             _row("sgd-bs16-wu0.65-lrx2-lrwsd-s2", 16, "83.6", "84.2")]  # fmt: skip
    _write(fake_regime / "r" / "regime.csv", rows)
    verdict = report.regime_verdict()
    assert "no verdict yet" not in verdict and "**not met**" in verdict


def test_inline_values(fake_regime):
    assert report.value("regime/baseline/name") == "sgd-bs16-wu0.65-lrwsd"
    assert report.value("regime/baseline/mean/holdout_ap") == "82.70"
    assert report.value("regime/baseline/sd/holdout_ap") == "0.10"
    assert report.value("regime/sgd-bs16-wu0.65/n/box_ap") == "3"
    # 83.5 - 83.7 on three seeds each
    assert report.value("regime/pmd_lamb-bs256-lrwsd-wd0.01~baseline/diff/box_ap") == "-0.20"
    with pytest.raises(KeyError, match="no cell family"):
        report.value("regime/nothing/mean/box_ap")
    with pytest.raises(KeyError, match="unknown CSV"):
        report.value("nope/baseline/mean/box_ap")


def test_describe_reads_the_cell_names():
    assert report.describe("pmd_lamb-bs1024-ep1.4x-lrx1.5-b20.99-s1") == (
        "PMD-LAMB, batch 1024, 1.4x the epochs, LR x1.5, beta2 0.99, s1")
    assert report.describe("pmd_lamb-bs1024-T38-cosine") == "PMD-LAMB, batch 1024, period T = 38"
    assert report.describe("pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01-ramp256e1.68-512e3.36").endswith(
        "batch ramp: 256 to epoch 1.68, 512 to epoch 3.36")


def _add_rows(root, new):
    rows = list(csv.DictReader(open(root / "r" / "regime.csv")))
    _write(root / "r" / "regime.csv", rows + new)


def test_goal_and_moonshot_follow_welchs_bound_on_one_machine(fake_regime):
    """At 1.0x: -0.2 held-out, SDs 0.1 and 0.1 on three seeds each: Welch's lower bound is
    -0.2 - t(0.95, 4) * sqrt(0.01/3 + 0.01/3) = -0.374 >= -0.5: the moonshot; no 1.4x row
    yet, so the goal is not shown."""
    verdict = report.regime_verdict()
    assert "**EPYC, 1.0x** (moonshot" in verdict
    assert "held-out -0.20 [-0.43, +0.03], lower bound -0.37" in verdict and "**met**" in verdict
    assert "goal (1.4x) **not shown**, moonshot (1.0x) **met** on EPYC" in verdict
    assert not report.regime_goal()
    _add_rows(fake_regime, [_row(f"pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01{s}", 256, h, "83.7")
                            for s, h in (("", "82.6"), ("-s1", "82.7"), ("-s2", "82.8"))])  # fmt: skip
    assert report.regime_goal()
    # the fake CSV lacks the grid's batch-16 LR sweep: the verdict names those cells
    pending = report.pending_batch16_cells()
    assert "sgd-bs16-wu0.65-lrx2-lrwsd" in pending and "sgd-bs16-wu0.65" not in pending
    assert "`sgd-bs16-wu0.65-lrx2-lrwsd`" in report.regime_verdict()


def test_goal_not_met_with_a_wide_interval(fake_regime):
    rows = list(csv.DictReader(open(fake_regime / "r" / "regime.csv")))
    for r in rows:
        if r["cell"] == "pmd_lamb-bs256-lrwsd-wd0.01-s2":
            r["holdout_ap"], r["box_ap"] = "79.0", "80.0"
    _write(fake_regime / "r" / "regime.csv", rows)
    verdict = report.regime_verdict()
    assert "moonshot (1.0x) **not shown**" in verdict and "**not met**" in verdict


def test_rows_of_another_machine_class_make_no_verdict(fake_regime):
    """The large batch on a Xeon VM, the baseline on the EPYC VM: no class has both sides."""
    rows = list(csv.DictReader(open(fake_regime / "r" / "regime.csv")))
    for r in rows:
        if int(r["batch"]) > 16:
            r["device"] = "2-core Intel Xeon VM (AMX), CPU, 1 thread per run"
    _write(fake_regime / "r" / "regime.csv", rows)
    verdict = report.regime_verdict()
    assert "Xeon-AMX" not in verdict and "EPYC, 1.0x" not in verdict  # no class holds both sides
    assert "moonshot (1.0x) **not shown**" in verdict and not report.regime_goal()


def test_fill_blocks_and_inline_values(fake_regime):
    md = ("Baseline <!--v regime/baseline/mean/box_ap-->0<!--/v--> AP.\n"
          "<!-- BEGIN generated regime-cells -->\nold\n<!-- END generated regime-cells -->\n")
    out = report.fill(md)
    assert "<!--v regime/baseline/mean/box_ap-->83.70<!--/v-->" in out
    assert ("| `sgd-bs16-wu0.65-lrwsd` | SGD, batch 16, warm-up 0.65 epochs, WSD LR | 100 | 3 | "
            "82.70 ± 0.10 | 83.70 ± 0.10 | 0.200 | EPYC |") in out
    assert "old" not in out
    assert report.fill(out) == out
    yml = "# BEGIN generated regime-verdict\n# stale\n# END generated regime-verdict\nA: 1\n"
    filled = report.fill(yml, yaml=True)
    assert all(line.startswith("#") or line == "A: 1" for line in filled.splitlines())
    with pytest.raises(KeyError, match="unknown generated block"):
        report.fill("<!-- BEGIN generated nope -->\n<!-- END generated nope -->")


def test_check_names_a_stale_file(fake_regime, monkeypatch):
    doc = fake_regime / "docs"
    os.makedirs(doc)
    (doc / "page.md").write_text("AP <!--v regime/baseline/mean/box_ap-->83.70<!--/v-->\n")
    monkeypatch.setattr(report, "FILES", ("docs",))
    assert report.check() == []
    (doc / "page.md").write_text("AP <!--v regime/baseline/mean/box_ap-->83.71<!--/v-->\n")
    assert report.check() == ["docs/page.md"]
    assert report.write() == ["docs/page.md"]
    assert report.check() == []


def test_docs_match_their_csvs():
    """Every generated table and number in README.md, docs/, the video README and the
    configs' comments is what its CSV gives (``python study/study_report.py``)."""
    assert report.check() == []


VIDEO_FIELDS = ["cell", "batch", "iterations", "top1", "holdout_top1", "diverged", "final_loss",
                "device", "val_videos", "holdout_videos", "train_s"]


def _write_video(path, rows):
    """A tsm4k-shaped CSV of ``rows`` (missing columns empty)."""
    write_csv(path, VIDEO_FIELDS, rows)


def test_video_verdict_needs_three_seeds_and_4096_videos(tmp_path, monkeypatch):
    def write(rows):
        _write_video(tmp_path / "v.csv", rows)

    def row(cell, batch, top1, holdout, videos=4096):
        return dict(cell=cell, batch=batch, iterations=10, top1=top1, holdout_top1=holdout,
                    diverged="no", final_loss="0.1", device="EPYC", val_videos=videos,
                    holdout_videos=2048)

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    base = [row("sgd-bs16", 16, "86.0", "85.0"), row("sgd-bs16-s1", 16, "86.4", "85.2"),
            row("sgd-bs16-s2", 16, "86.2", "85.4")]
    large = [row("pmd_lamb-bs256-ep1.4x", 256, "85.8", "85.0"), row("pmd_lamb-bs256-ep1.4x-s1", 256, "86.0", "85.1"),
             row("pmd_lamb-bs256-ep1.4x-s2", 256, "85.6", "84.9"),
             row("sgd-bs256-ep2x", 256, "99.0", "99.0"), row("sgd-bs256-ep2x-s1", 256, "99.0", "99.0"),
             row("sgd-bs256-ep2x-s2", 256, "99.0", "99.0")]
    write(base + large)
    text = report.video_verdict("video4k")
    # 2x is not <= 1.4x: the 1.4x PMD-LAMB rows are chosen; -0.40 with a bound above -2.0
    assert "- Goal: `pmd_lamb-bs256-ep1.4x` minus the baseline, reported top-1 within 1" in text
    assert "**met**" in text.split("Moonshot")[0] and "- Moonshot: no recipe" in text
    write([row(r["cell"], r["batch"], r["top1"], r["holdout_top1"], videos=1024) for r in base] + large)
    assert "**not met**" in report.video_verdict("video4k")


def test_the_interval_figure_draws_the_tables_numbers(fake_regime):
    """The figure of the regime comparison draws each row's difference as the table prints
    it, best held-out difference on top, and writes the picture."""
    from largedet_study import interval_plot

    path = fake_regime / "regime_intervals.png"
    drawn = interval_plot.FIGURES["study/results/figures/regime_intervals.png"](str(path))
    assert path.stat().st_size > 10_000
    table = report.regime_comparison()
    assert [label for label, _ in drawn] == [
        "pmd_lamb-bs256-ep2x-lrwsd-wd0.01", "pmd_lamb-bs256-lrwsd-wd0.01", "sgd-bs16-wu0.65 (batch 16)"]
    # 90.0 - mean(82.6, 82.8, 82.7) held-out; 83.5 - 83.7 reported
    assert drawn[0][1]["held-out"] == pytest.approx(90.0 - 82.7)
    assert drawn[1][1]["reported"] == pytest.approx(-0.2)
    for label, diffs in drawn:
        line = next(row for row in table.splitlines() if row.startswith(f"| `{label.split(' (')[0]}`"))
        for value in diffs.values():
            assert f"{value:+.2f}" in line, (label, line)


def test_multigrid_table_pairs_seeds_and_states_the_speed_up(tmp_path, monkeypatch):
    """Multigrid against its own step-schedule row: the wall clock's speed-up seed by seed
    (an unpaired seed counts in the means, never in a ratio), and whether it trains (above
    80% of the baseline's reported top-1)."""
    def row(cell, batch, top1, holdout, wall):
        return dict(cell=cell, batch=batch, iterations=10, top1=top1, holdout_top1=holdout,
                    diverged="no", final_loss="0.1", device="EPYC", val_videos=4096,
                    holdout_videos=2048, train_s=wall)

    def write(rows):
        _write_video(tmp_path / "v.csv", rows)

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    base = [row("sgd-bs16", 16, "86.0", "85.0", "9000"), row("sgd-bs16-s1", 16, "86.4", "85.2", "9000")]
    write(base + [row("sgd-bs128-multigrid", 128, "80.0", "79.0", "1000")])
    assert report.multigrid_table() == "\n".join(report.multigrid_table().splitlines()[:2] + [
        "| `sgd-bs128-multigrid` / `-` | 1/0 | 79.00 / - | 80.00 / - | - | - | - | yes (93% of `sgd-bs16`) |"])
    write(base + [
        row("sgd-bs128-multigrid", 128, "80.0", "79.0", "1000"),
        row("sgd-bs128-multigrid-s1", 128, "70.0", "69.0", "1200"),
        row("sgd-bs128-multigrid-s2", 128, "60.0", "59.0", "1100"),  # no pair: no ratio
        row("sgd-bs128-lrstep", 128, "84.0", "83.0", "2500"),
        row("sgd-bs128-lrstep-s1", 128, "85.0", "84.0", "2400"),
    ])
    line = report.multigrid_table().splitlines()[2]
    # reported top-1 70.00 ± 10.00 against 84.50 ± 0.71; speed-ups 2500/1000, 2400/1200;
    # 70 / 86.2 = 81% of the baseline
    assert line.startswith("| `sgd-bs128-multigrid` / `sgd-bs128-lrstep` | 3/2 | 69.00 ± 10.00 / 83.50 ± 0.71 "
                           "| 70.00 ± 10.00 / 84.50 ± 0.71 | -14.50 [")
    assert line.endswith("| 1100 / 2450 | 2.25x (2.50, 2.00) | yes (81% of `sgd-bs16`) |")
    write(base + [row("sgd-bs128-multigrid", 128, "68.0", "67.0", "1000")])
    assert report.multigrid_table().splitlines()[2].endswith("| no (79% of `sgd-bs16`) |")
    # the short cycle alone pairs with the same step-schedule row
    write(base + [row("sgd-bs128-multigrid-short", 128, "84.0", "83.0", "1250"),
                  row("sgd-bs128-lrstep", 128, "84.0", "83.0", "2500")])
    assert report.multigrid_table().splitlines()[2].startswith(
        "| `sgd-bs128-multigrid-short` / `sgd-bs128-lrstep` | 1/1 |")
    assert "| 2.00x (2.00) | yes (97% of `sgd-bs16`) |" in report.multigrid_table()


def test_multigrid_verdict_takes_two_seeds_a_side_and_states_the_speed_up(tmp_path, monkeypatch):
    """The verdict's multigrid line: only a multigrid family with two seeds whose row without
    multigrid has the same two counts; the best reported top-1 among those; "met" above 80%
    of the baseline's top-1, with the speed-up seed by seed."""
    def row(cell, batch, top1, wall):
        return dict(cell=cell, batch=batch, iterations=10, top1=top1, holdout_top1=top1, diverged="no",
                    final_loss="0.1", device="EPYC", val_videos=4096, holdout_videos=2048, train_s=wall)

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    base = [row("sgd-bs16", 16, "85.0", "9000"), row("sgd-bs16-s1", 16, "87.0", "9000"),
            row("sgd-bs16-s2", 16, "86.0", "9000")]
    short = [row("sgd-bs128-multigrid-short-ep2x", 128, "75.0", "1400"),
             row("sgd-bs128-multigrid-short-ep2x-s1", 128, "73.0", "1500"),
             row("sgd-bs128-ep2x-lrstep", 128, "84.0", "2100"),
             row("sgd-bs128-ep2x-lrstep-s1", 128, "82.0", "1800")]
    # one seed of the better multigrid row: it does not count
    one_seed = [row("sgd-bs128-multigrid-lrheld", 128, "84.0", "300"), row("sgd-bs128-lrstep", 128, "84.0", "900")]
    _write_video(tmp_path / "v.csv", base + one_seed)
    assert report.multigrid_verdict() == (
        "- Multigrid: no multigrid row and its row without multigrid have two seeds each yet: not met.")
    _write_video(tmp_path / "v.csv", base + one_seed + short)
    line = report.multigrid_verdict()
    # 74 / 86 = 86%; 74 - 83 = -9; 2100/1400 = 1.50, 1800/1500 = 1.20, mean 1.35
    assert line.startswith("- Multigrid: `sgd-bs128-multigrid-short-ep2x` (n=2), reported top-1 74.00 ± 1.41, "
                           "86% of the baseline's (the bar: above 80%); against `sgd-bs128-ep2x-lrstep` (n=2) -9.00 [")
    assert line.endswith("its training 1.35x as fast (per seed 1.50, 1.20): **met**.")
    assert line in report.video_verdict("video4k").splitlines()
    _write_video(tmp_path / "v.csv", base + [dict(r, top1="68.0") if "multigrid" in r["cell"] else r for r in short])
    assert report.multigrid_verdict().endswith("**not met**.")


def test_recipe_table_words_a_video_rows_schedule(tmp_path, monkeypatch):
    """The recipe table names the LR schedule a row ran: a video row without one in its name
    ran cosine, a multigrid row the step schedule."""
    def row(cell, batch, top1):
        return dict(cell=cell, batch=batch, iterations=10, top1=top1, holdout_top1=top1, diverged="no",
                    final_loss="0.1", device="EPYC", val_videos=4096, holdout_videos=2048, train_s="100")

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    _write_video(tmp_path / "v.csv", [
        row("sgd-bs16", 16, "86.0"), row("sgd-bs16-s1", 16, "86.0"), row("sgd-bs16-s2", 16, "86.0"),
        row("sgd-bs256", 256, "85.0"), row("sgd-bs256-s1", 256, "85.0"),
        row("sgd-bs128-multigrid-short-ep2x", 128, "84.0"), row("sgd-bs128-multigrid-short-ep2x-s1", 128, "84.0")])
    lines = report.recipe_table().splitlines()
    assert "| 128 (3.12%) | SGD, multigrid, the short cycle alone, step LR | 2x | 2/3 | -2.00 [" in "\n".join(lines)
    assert "| 256 (6.25%) | SGD, cosine LR | 1x | 2/3 | -1.00 [" in "\n".join(lines)


def test_goal_prints_every_verdict_and_the_optimizer_table(capsys):
    """``study_report.py --goal``: the regime verdicts, the PMD-LAMB / LAMB / SGD table, the
    video verdict and multigrid's, each as its block gives it; exit 1 unless the regime goal is met."""
    import runpy

    script = runpy.run_path(os.path.join(report.ROOT, "study", "study_report.py"))
    code = script["main"](["--goal"])
    out = capsys.readouterr().out
    assert code == (0 if report.regime_goal() else 1)
    for heading, block in (("Detection, regime grid:", report.regime_verdict()),
                           ("The optimizers at batch 256 (regime grid):", report.regime_optimizers()),
                           ("Video, tsm4k grid:", report.video_verdict("video4k")),
                           ("Multigrid's time to accuracy, mg_time grid:", report.BLOCKS["mg-time-verdict"]()),
                           ("Video, tsm4k grid on one EPYC-Zen5 VM, both sides tuned alike:",
                            report.video_verdict("video4k_zen5")),
                           ("Multigrid's time to accuracy at base batch 16, mg_time16 grid:",
                            report.BLOCKS["mg-time16-verdict"]()),
                           ("Multigrid's time to accuracy on the 64-px, 16-frame task, mg_time64 grid:",
                            report.BLOCKS["mg-time64-verdict"]())):  # fmt: skip
        assert f"{heading}\n{block}\n" in out


def _add_amx_rows(root):
    """An AMX Xeon's baseline (81.1 held-out, three seeds) and 1.4x recipe (81.5) beside the
    fixture's EPYC rows."""
    amx = "2-core Intel Xeon VM (AMX), CPU, 1 thread per run"
    _add_rows(root, [_row(f"sgd-bs16-wu0.65-lrx4-lrwsd{s}", 16, h, "82.0", amx)
                     for s, h in (("", "81.0"), ("-s1", "81.2"), ("-s2", "81.1"))]
              + [_row(f"pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01{s}", 256, h, "82.0", amx)
                 for s, h in (("", "81.5"), ("-s1", "81.6"), ("-s2", "81.4"))])  # fmt: skip


def test_the_readme_table_compares_each_detection_row_with_its_own_machines_baseline(fake_regime):
    """The fixture's rows ran on the EPYC; an AMX Xeon's baseline (lower, 81.1 held-out) and
    1.4x recipe (81.5) are added. Each row is against its own class's baseline: EPYC 1.0x
    82.5 - 82.7 = -0.20 and AMX 1.4x 81.5 - 81.1 = +0.40 (SDs 0.1, three seeds a side:
    Welch's t on 4 degrees of freedom), and no row pairs two classes."""
    _add_amx_rows(fake_regime)
    table = report.results_summary()
    rows = [line for line in table.splitlines() if line.startswith("| detection")]
    assert len(rows) == 3  # EPYC: 1.0x and 2x; AMX: 1.4x
    epyc_1x = next(r for r in rows if "| 1.0x |" in r)
    assert "-0.20 [-0.43, +0.03]" in epyc_1x and epyc_1x.endswith("| EPYC / EPYC |")
    amx_14x = next(r for r in rows if "| 1.4x |" in r)
    assert "+0.40 [+0.17, +0.63]" in amx_14x and amx_14x.endswith("| Xeon-AMX / Xeon-AMX |")
    assert "detection on EPYC: `sgd-bs16-wu0.65-lrwsd` (3 seeds); detection on Xeon-AMX: " \
           "`sgd-bs16-wu0.65-lrx4-lrwsd` (3 seeds)" in table


def test_the_regime_tables_and_inline_keys_compare_within_one_machine_class(fake_regime):
    """The recipe table, the comparison table, the configs' measured line and the
    ``regime_all`` inline keys put each row against its own class's baseline: with the AMX
    Xeon's rows of the test above, EPYC's 1.0x recipe is 82.5 - 82.7 = -0.20 against
    `sgd-bs16-wu0.65-lrwsd`, AMX's 1.4x recipe 81.5 - 81.1 = +0.40 against
    `sgd-bs16-wu0.65-lrx4-lrwsd`, and no table holds a row of the other class. The grid-wide
    key (``regime/...~baseline``) still takes the best batch-16 mean of the main CSV, EPYC's."""
    _add_amx_rows(fake_regime)
    assert report.value("regime_all/baseline@Xeon-AMX/name") == "sgd-bs16-wu0.65-lrx4-lrwsd"
    assert report.value("regime_all/baseline@EPYC/name") == "sgd-bs16-wu0.65-lrwsd"
    assert report.value("regime_all/pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01@Xeon-AMX~baseline@Xeon-AMX/diff/holdout_ap") == "+0.40"
    assert report.value("regime_all/pmd_lamb-bs256-lrwsd-wd0.01@EPYC~baseline@EPYC/diff/holdout_ap") == "-0.20"
    assert report.value("regime_all/=sgd-bs16-wu0.65-lrx4-lrwsd@Xeon-AMX/row/holdout_ap") == "81.0"
    with pytest.raises(KeyError, match="no batch-16 row on machine class 'H100'"):
        report.value("regime_all/baseline@H100/name")
    # the grid-wide baseline (pooled over classes) is the main CSV's best batch-16 mean: 82.7
    assert report.value("regime/baseline/name") == "sgd-bs16-wu0.65-lrwsd"

    sections = {}
    for part in report.recipe_table().split("**Detection, regime grid, ")[1:]:
        cls, _, body = part.partition("**")
        sections[cls] = body.split("**Detection, steps grid**")[0]
    assert set(sections) == {"EPYC", "Xeon-AMX"}
    assert "the baseline `sgd-bs16-wu0.65-lrx4-lrwsd`, n=3" in sections["Xeon-AMX"]
    assert "| 256 (1.04%) | PMD-LAMB, WSD LR, wd 0.01 | 1.4x | 3/3 | +0.40 [+0.17, +0.63] |" in sections["Xeon-AMX"]
    assert "| 1x |" not in sections["Xeon-AMX"]  # the 1.0x and 2x rows ran on EPYC only
    assert "| 256 (1.04%) | PMD-LAMB, WSD LR, wd 0.01 | 1x | 3/3 | -0.20 [-0.43, +0.03] |" in sections["EPYC"]
    assert "| 1.4x |" not in sections["EPYC"]

    comparison = report.regime_comparison()
    assert comparison.index("**Xeon-AMX**") >= 0 and comparison.index("**EPYC**") >= 0
    for block in comparison.split("\n\n**"):
        header = next(line for line in block.splitlines() if line.startswith("| against"))
        cls = "Xeon-AMX" if "lrx4" in header else "EPYC"
        rows = [line for line in block.splitlines() if line.startswith("| `")]
        assert rows and all(f"| {cls} |" in line for line in rows), block
    line = report.config_regime().replace("\n", " ")
    assert "1.0x -0.20 (-0.43, +0.03) held-out" in line and "n=3 on EPYC, against [regime: sgd-bs16-wu0.65-lrwsd]" in line
    assert "1.4x +0.40 (+0.17, +0.63) held-out" in line and "on Xeon-AMX, against [regime: sgd-bs16-wu0.65-lrx4-lrwsd]" in line


def test_the_video_verdict_says_whether_each_sides_lr_optimum_is_bracketed(tmp_path, monkeypatch):
    """Each side's LR sweep in the verdict: the factors its seed-0 rows tried with their
    held-out top-1, and "at an edge" until the chosen factor has a tried factor on each side."""
    def row(cell, batch, holdout):
        return dict(cell=cell, batch=batch, iterations=10, top1="80.0", holdout_top1=holdout, diverged="no",
                    final_loss="0.1", device="EPYC", val_videos=4096, holdout_videos=2048, train_s="100")

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    rows = [row("sgd-bs16", 16, "84.0"), row("sgd-bs16-lrx2", 16, "86.0"), row("sgd-bs16-lrx2-s1", 16, "86.2"),
            row("sgd-bs16-lrx2-s2", 16, "85.8"), row("sgd-bs16-lrx0.5", 16, "83.0"),
            row("pmd_lamb-bs256", 256, "84.5"), row("pmd_lamb-bs256-s1", 256, "84.0"),
            row("pmd_lamb-bs256-s2", 256, "84.1"), row("pmd_lamb-bs256-lrx2", 256, "83.0"),
            row("pmd_lamb-bs256-wu10", 256, "70.0")]  # another axis: not a point of the LR sweep
    _write_video(tmp_path / "v.csv", rows)
    lines = report.video_verdict("video4k").splitlines()
    assert "- Batch 16's LR: `sgd-bs16-lrx2` (x2); tried x0.5 83.0, x1 84.0, x2 86.0 (seed 0, held-out top-1): " \
           "**at an edge of its sweep**." in lines
    assert "- The goal's recipe's LR: `pmd_lamb-bs256` (x1); tried x1 84.5, x2 83.0 (seed 0, held-out top-1): " \
           "**at an edge of its sweep**." in lines
    _write_video(tmp_path / "v.csv", rows + [row("sgd-bs16-lrx4", 16, "85.0"), row("pmd_lamb-bs256-lrx0.5", 256, "80.0")])
    lines = report.video_verdict("video4k").splitlines()
    assert "- Batch 16's LR: `sgd-bs16-lrx2` (x2); tried x0.5 83.0, x1 84.0, x2 86.0, x4 85.0 (seed 0, held-out top-1): " \
           "bracketed." in lines
    assert "- The goal's recipe's LR: `pmd_lamb-bs256` (x1); tried x0.5 80.0, x1 84.5, x2 83.0 (seed 0, held-out top-1): " \
           "bracketed." in lines


def test_precise_bn_cache_table_gives_each_machines_ranges(tmp_path):
    """The precise-BN benchmark's table: one line per CPU, load and size, the range over the
    processes of each column, the ratio with an x."""
    from largedet_study.video_bench_report import precise_bn_cache_table

    fields = ["date", "cpu", "cpu_family_model", "isa", "cores", "torch", "load", "process", "videos",
              "iters", "batch", "passes", "own_cache_s", "shared_cache_s", "ratio"]  # fmt: skip
    base = dict(date="2026-12-04", cpu="AMD EPYC", cpu_family_model="26/2", isa="avx512", cores="2",
                torch="2.14.1", load="", videos="4096", iters="200", batch="16", passes="2")  # fmt: skip
    rows = [dict(base, process=str(k), own_cache_s=own, shared_cache_s=shared, ratio=ratio)
            for k, (own, shared, ratio) in enumerate((("13.6", "2.7", "5.04"), ("10.6", "2.4", "4.42")), 1)]
    rows.append(dict(base, cpu="Intel Xeon", cpu_family_model="6/143", process="1", own_cache_s="20",
                     shared_cache_s="4", ratio="5"))  # fmt: skip
    write_csv(tmp_path / "p.csv", fields, rows)
    table = precise_bn_cache_table(str(tmp_path / "p.csv")).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| AMD EPYC (26/2) | 2.14.1 | nothing | 4096 | 200 x 16 | 2 | 10.60-13.60 | 2.40-2.70 | 4.42-5.04x |")
    assert table[3].startswith("| Intel Xeon (6/143) | 2.14.1 | nothing | 4096 | 200 x 16 | 1 | 20.00 | 4.00 | 5.00x |")


def test_the_video_baseline_is_chosen_by_seed_0_as_the_regime_grids(tmp_path, monkeypatch):
    """Seed 0 per batch-16 candidate chooses, whatever the chosen one's later seeds: a
    candidate whose three seeds average below another's one seed stays the baseline."""
    def row(cell, holdout):
        return dict(cell=cell, batch=16, iterations=10, top1=holdout, holdout_top1=holdout, diverged="no",
                    final_loss="0.1", device="EPYC", val_videos=4096, holdout_videos=2048, train_s="100")

    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    monkeypatch.setattr(report, "CSVS", {**report.CSVS, "video4k": "v.csv"})
    _write_video(tmp_path / "v.csv", [row("sgd-bs16", "85.9"), row("sgd-bs16-lrx2", "86.0"),
                                      row("sgd-bs16-lrx2-s1", "84.0"), row("sgd-bs16-lrx2-s2", "84.5")])
    assert report.video_baseline("video4k").name == "sgd-bs16-lrx2"
