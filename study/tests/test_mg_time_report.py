"""Multigrid's time to accuracy (largedet_study.mg_time_report) on a small synthetic CSV:
the machine class kept, speed-ups seed by seed, the time to the plain schedule's top-1,
Welch's bound, the held-out choice and the figure; every number computed here again."""

import csv
import math
import statistics

import pytest

from largedet_study import mg_time_report as mt

ICL = "2-core Intel Xeon Ice Lake VM (model 106)"
EPYC = "2-core AMD EPYC VM"
# cell: (train_s, held-out top-1, reported top-1) per seed 0, 1, 2
DATA = {
    "sgd-bs128-lrstep": [(1000, 84.0, 84.9), (1100, 84.2, 85.0), (900, 84.4, 85.1)],
    "sgd-bs128-ep0.5x-lrstep": [(500, 80.0, 80.0), (550, 81.0, 81.0), (450, 82.0, 82.0)],
    "sgd-bs128-multigrid-short": [(400, 84.0, 85.0), (500, 84.5, 85.1), (300, 85.0, 85.2)],
    "sgd-bs128-multigrid-long-lrheld": [(500, 82.0, 83.0), (550, 83.0, 84.0), (450, 83.5, 84.5)],
    "sgd-bs128-multigrid-long-lrheld-ep2x": [(1000, 85.0, 86.0), (1100, 85.0, 86.0), (900, 85.0, 85.5)],
    "sgd-bs128-multigrid-lrheld": [(250, 79.0, 80.0), (275, 80.0, 81.0)],
}


def rows():
    out = []
    for cell, seeds in DATA.items():
        for seed, (t, ho, top1) in enumerate(seeds):
            # the machine-speed probes: the reference's 20-21 ms (median 20.5), the others swung by a
            # neighbour's load but within a factor 1.5
            probes = ("20.0", "21.0") if cell == "sgd-bs128-lrstep" else ("14.0", "30.0")
            out.append({"cell": cell + (f"-s{seed}" if seed else ""), "train_s": str(t), "holdout_top1": str(ho),
                        "top1": str(top1), "diverged": "no", "device": ICL,
                        "probe_ms_min": probes[0], "probe_ms_max": probes[1]})  # fmt: skip
    # left out: a diverged seed, a row of another machine class, a row at another machine
    # speed (a probe a factor 1.51 above the reference's) and a row without a probe
    out.append({"cell": "sgd-bs128-multigrid-lrheld-s2", "train_s": "260", "holdout_top1": "", "top1": "",
                "diverged": "yes", "device": ICL, "probe_ms_min": "20", "probe_ms_max": "20"})
    out.append({"cell": "sgd-bs128-multigrid-long-lrheld-s3", "train_s": "100", "holdout_top1": "99", "top1": "99",
                "diverged": "no", "device": EPYC, "probe_ms_min": "20", "probe_ms_max": "20"})
    out.append({"cell": "sgd-bs128-multigrid-short-s3", "train_s": "100", "holdout_top1": "99", "top1": "99",
                "diverged": "no", "device": ICL, "probe_ms_min": "20.0", "probe_ms_max": "31.0"})
    out.append({"cell": "sgd-bs128-multigrid-short-s4", "train_s": "100", "holdout_top1": "99", "top1": "99",
                "diverged": "no", "device": ICL, "probe_ms_min": "", "probe_ms_max": ""})
    return out


def t_quantile_95(df):
    """Student's t 95% quantile at (fractional) ``df``: the density integrated by Simpson's
    rule from 0, the bound found by bisection (computed here, not by largedet_study.stats)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x, n=2000):
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.95 else (lo, mid)
    return (lo + hi) / 2


def test_the_independent_t_quantile_matches_the_tables():
    # Student's t tables: 2.919986 (2 df), 2.353363 (3), 2.015048 (5)
    for df, expected in ((2, 2.919986), (3, 2.353363), (5, 2.015048)):
        assert t_quantile_95(df) == pytest.approx(expected, abs=1e-5)


def welch_lower_bound(a, b):
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return statistics.mean(a) - statistics.mean(b) - t_quantile_95(df) * (va + vb) ** 0.5


def test_points_keep_the_references_machine_class_and_trained_rows():
    pts, cls = mt.points(rows())
    assert cls == "Xeon-ICL"
    assert list(pts) == [("plain", 0.5), ("plain", 1.0), ("multigrid-lrheld", 1.0), ("multigrid-long-lrheld", 1.0),
                         ("multigrid-long-lrheld", 2.0), ("multigrid-short", 1.0)]  # fmt: skip
    assert pts[("multigrid-long-lrheld", 1.0)].by_seed("train_s") == {0: 500.0, 1: 550.0, 2: 450.0}
    assert pts[("multigrid-lrheld", 1.0)].by_seed("top1") == {0: 80.0, 1: 81.0}


def test_rows_at_another_machine_speed_or_without_a_probe_are_left_out():
    median, off, missing = mt.speed_check(rows())
    assert median == 20.5  # the reference rows' probes: 20.0 and 21.0, three times
    # 31.0 > 20.5 x 1.5 = 30.75; 14.0 and 30.0 lie inside [20.5 / 1.5, 30.75] = [13.67, 30.75]
    assert off == ["sgd-bs128-multigrid-short-s3"] and missing == ["sgd-bs128-multigrid-short-s4"]
    pts, _ = mt.points(rows())
    assert sorted(pts[("multigrid-short", 1.0)].by_seed("train_s")) == [0, 1, 2]
    note = ("; the reference's machine-speed probe 20.5 ms (the rows compared: 14.0 to 30.0 ms); left out at "
            "another machine speed (a probe beyond a factor 1.5): `sgd-bs128-multigrid-short-s3`; left out without "
            "a speed probe: `sgd-bs128-multigrid-short-s4`")
    assert mt.mg_time_table(rows()).splitlines()[0] == (
        "Machine class Xeon-ICL; reference: the plain step schedule at 1x the epochs (n=3)" + note + ".")
    assert mt.mg_time_verdict(rows()).splitlines()[0].endswith("4 multigrid points (schedule x epochs) measured"
                                                                + note + ".")
    # a faster machine too: 13.5 < 20.5 / 1.5
    fast = rows() + [{"cell": "sgd-bs128-multigrid-short-s5", "train_s": "100", "holdout_top1": "99", "top1": "99",
                      "diverged": "no", "device": ICL, "probe_ms_min": "13.5", "probe_ms_max": "20"}]
    assert mt.speed_check(fast)[1] == ["sgd-bs128-multigrid-short-s3", "sgd-bs128-multigrid-short-s5"]
    # a reference without probes: nothing is at a known speed, so nothing is compared
    bare = [dict(r, probe_ms_min="", probe_ms_max="") if r["cell"].startswith("sgd-bs128-lrstep") else r
            for r in rows()]  # fmt: skip
    assert mt.points(bare)[0] == {}
    assert mt.mg_time_verdict(bare).startswith("- No plain-schedule row of this grid yet (left out without "
                                               "a speed probe: `sgd-bs128-lrstep`")


def test_speed_ups_seed_by_seed():
    pts, _ = mt.points(rows())
    ref = pts[("plain", 1.0)]
    assert mt.speed_ups(pts[("multigrid-short", 1.0)], ref) == pytest.approx([1000 / 400, 1100 / 500, 900 / 300])
    assert mt.speed_ups(pts[("multigrid-lrheld", 1.0)], ref) == pytest.approx([4.0, 4.0])


def test_time_to_reach():
    assert mt.time_to_reach([(500, 83.0), (1000, 86.0)], 85.0) == (pytest.approx(500 + 2 / 3 * 500), False)
    assert mt.time_to_reach([(400, 85.0), (800, 86.0)], 85.0) == (400, True)
    assert mt.time_to_reach([(400, 80.0), (800, 84.0)], 85.0) is None
    pts, _ = mt.points(rows())
    # target 85.0: seed 0 83 -> 86 over 500 -> 1000 s; seed 1 84 -> 86 over 550 -> 1100; seed 2
    # 84.5 -> 85.5 over 450 -> 900
    reached = mt.reach_speed_ups("multigrid-long-lrheld", pts, 85.0)
    expected = {0: 1000 / (500 + 2 / 3 * 500), 1: 1100 / (550 + 0.5 * 550), 2: 900 / (450 + 0.5 * 450)}
    assert {s: v[0] for s, v in reached.items()} == pytest.approx(expected)
    assert not any(v[1] for v in reached.values())
    assert mt.reach_speed_ups("multigrid-lrheld", pts, 85.0) == {0: None, 1: None}


def test_table_numbers():
    text = mt.mg_time_table(rows())
    line = next(x for x in text.splitlines() if x.startswith("| multigrid, short cycle alone, 1x"))
    ratios = [2.5, 2.2, 3.0]
    assert f"| 3 | 400 ± 100 | {statistics.mean(ratios):.2f} ± {statistics.stdev(ratios):.2f}x (2.50, 2.20, 3.00) |" in line
    a, b = [85.0, 85.1, 85.2], [84.9, 85.0, 85.1]
    bound = welch_lower_bound(a, b)
    assert bound > mt.GOAL_LOWER_BOUND
    assert f"| +0.10 [" in line and f"| {bound:+.2f} | goal |" in line
    long_line = next(x for x in text.splitlines() if x.startswith("| multigrid, long cycle alone, LR held, 1x"))
    assert long_line.endswith("| no |")  # 2.0x as fast, but its bound is below -1
    # the time to the reference's top-1 (85.00): the long cycle seed by seed; the short cycle
    # is above it at its first budget already
    long_reach = [1000 / (500 + 2 / 3 * 500), 1100 / 825, 900 / 675]
    assert (f"- multigrid, long cycle alone, LR held: {statistics.mean(long_reach):.2f} ± {statistics.stdev(long_reach):.2f}x "
            f"(n=3); s0: {long_reach[0]:.2f}, s1: {long_reach[1]:.2f}, s2: {long_reach[2]:.2f}.") in text
    assert "- multigrid, short cycle alone: 2.57 ± 0.40x (n=3); s0: ≥2.50, s1: ≥2.20, s2: ≥3.00." in text
    assert "- multigrid, long + short cycle, LR held: not reached; s0: not reached, s1: not reached." in text


def test_verdict_held_out_chooses_reported_reports():
    text = mt.mg_time_verdict(rows()).splitlines()
    assert text[0].startswith("- Reference: the plain step schedule at 1x, reported top-1 85.00 ± 0.10 (n=3)")
    assert "4 multigrid points" in text[0]
    # >= 2x with three seeds: the short cycle (2.57x, held-out 84.50) and the long cycle
    # (2.00x, 82.83); the held-out split picks the short cycle
    bound = welch_lower_bound([85.0, 85.1, 85.2], [84.9, 85.0, 85.1])
    assert text[1].startswith("- Goal (>= 2x as fast, lower bound >= -1.0): the held-out split chooses "
                              "multigrid, short cycle alone, 1x the epochs among 2")
    assert text[1].endswith(f"lower bound {bound:+.2f}: **met**.")
    # >= 3x: only the two-seed long + short cycle
    assert text[2] == "- Moonshot: no multigrid point with three seeds is 3x as fast yet: not met."


def test_empty_csv_and_figure(tmp_path):
    assert mt.mg_time_table([]) == "(no plain-schedule row of this grid yet)"
    assert mt.mg_time_verdict([]).endswith("goal not met.")
    path = tmp_path / "mg.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows()[0]))
        w.writeheader()
        w.writerows(rows())
    assert len(mt.load(str(path))) == len(rows())
    assert mt.load(str(tmp_path / "none.csv")) == []
    figure = mt.plot_top1_vs_time(mt.load(str(path)), str(tmp_path / "f" / "mg.png"))
    assert figure and (tmp_path / "f" / "mg.png").stat().st_size > 10_000
    assert mt.plot_top1_vs_time([], str(tmp_path / "none.png")) is None


def test_reference_alone_says_no_multigrid_row_yet():
    only_plain = [r for r in rows() if r["cell"].startswith("sgd-bs128-lrstep")]
    text = mt.mg_time_table(only_plain)
    assert "| plain step schedule, 1x the epochs | 3 |" in text
    assert text.splitlines()[-1] == "(no multigrid row yet: no speed-up to the reference's top-1)"
    assert "Speed-up to reach" not in text


def test_the_linear_rules_long_cycle_is_its_own_schedule_after_the_lr_held_ones():
    linear = [dict(r, cell=r["cell"].replace("-lrheld", ""), top1="12.5", holdout_top1="12.3")
              for r in rows() if r["cell"] in ("sgd-bs128-multigrid-lrheld", "sgd-bs128-multigrid-long-lrheld")]
    pts, _ = mt.points(rows() + linear)
    assert list(pts)[-2:] == [("multigrid", 1.0), ("multigrid-long", 1.0)]
    assert pts[("multigrid", 1.0)].label == "multigrid, long + short cycle, linear-rule LR, 1x the epochs"
    assert pts[("multigrid-long-lrheld", 1.0)].label == "multigrid, long cycle alone, LR held, 1x the epochs"
    line = next(x for x in mt.mg_time_table(rows() + linear).splitlines()
                if x.startswith("| multigrid, long cycle alone, linear-rule LR, 1x"))
    assert "| 12.30 | 12.50 |" in line and line.endswith("| - |")  # one seed: no interval, no mark


def test_a_row_without_a_training_time_is_named_and_left_out():
    untimed = rows() + [{"cell": "sgd-bs128-multigrid-short-s6", "train_s": "", "holdout_top1": "99", "top1": "99",
                         "diverged": "no", "device": ICL, "probe_ms_min": "20", "probe_ms_max": "20"}]
    assert mt.mg_time_table(untimed).splitlines()[0].endswith(
        "; left out without a training time (an invocation killed before it was recorded): "
        "`sgd-bs128-multigrid-short-s6`.")
    assert mt.points(untimed)[0] == mt.points(rows())[0]


def test_a_schedule_with_no_seed_of_the_references_is_said_so_not_called_unreached():
    """A multigrid curve whose seeds are not among the reference's rows (left out at another
    machine speed, or not run yet) has no per-seed time to the reference's top-1: the line
    says so instead of "not reached"."""
    some = [r for r in rows() if r["cell"] in ("sgd-bs128-lrstep-s1", "sgd-bs128-multigrid-short",
                                               "sgd-bs128-multigrid-short-s2", "sgd-bs128-multigrid-lrheld-s1")]
    lines = mt.mg_time_table(some).splitlines()
    assert "- multigrid, short cycle alone: no seed of its shared with the reference's rows compared." in lines
    # seed 1 is shared: 1100 s over the time to reach 85.0, where seed 1's single point (275 s, 81.0) does not
    assert "- multigrid, long + short cycle, LR held: not reached; s1: not reached." in lines
