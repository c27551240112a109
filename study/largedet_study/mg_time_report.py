"""Multigrid's time to accuracy: the ``mg_time`` video grid's CSV
(``study/video_batch_study.py --grid mg_time``) as tables, a verdict and a figure.

Each schedule (the plain step schedule and multigrid's: long and short cycle, the long cycle
alone, the short cycle alone; the long cycle's LR held at the base shape's or grown by the
linear rule) at each of its epoch budgets is a point of top-1 against
its training wall clock (``train_s``: the run less its evaluation). The reference is the plain
schedule at the base epochs (1x); rows of one machine class only, the reference's.

* Speed-up: the reference's ``train_s`` over the point's, seed by seed (a ratio is never
  taken between different seeds); its mean, sample SD and n.
* Time to the reference's top-1: per seed, the point of the schedule's curve (its budgets in
  order of time, linear between them) where its reported top-1 reaches the reference's mean;
  the speed-up to get there is that seed's reference ``train_s`` over that time (marked
  ">=" where the schedule's first budget is already above it: it got there sooner).
* Accuracy: the reported top-1 minus the reference's by Welch's t (the 95% interval and the
  one-sided 95% lower bound, :func:`largedet_study.fairness.welch`).
* Machine speed: a row counts only where its machine-speed probes (before and after each
  invocation, :mod:`largedet_study.speed_probe`) stand within a factor
  :data:`~largedet_study.speed_probe.FACTOR` of the median probe of the reference's rows:
  wall clocks are compared at one speed only.
* Verdict: the held-out split chooses, among the multigrid points with three seeds and a
  mean speed-up of at least :data:`GOAL_SPEEDUP` (:data:`MOONSHOT_SPEEDUP`), the one with the
  best held-out mean; the reported split reports it: the goal is met where its lower bound
  is at least :data:`GOAL_LOWER_BOUND`.

Registered in :data:`largedet_study.report.BLOCKS` as ``mg-time-table`` and
``mg-time-verdict``; ``python study/study_report.py --figures`` draws :func:`plot_top1_vs_time`.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .fairness import machine_class, welch
from .speed_probe import FACTOR as PROBE_FACTOR
from .stats import Summary, fmt, summarize

__all__ = [
    "BLOCKS", "GOAL_LOWER_BOUND", "GOAL_SPEEDUP", "MG_TIME_CSV", "MG_TIME16_CSV", "MG_TIME64_CSV", "MOONSHOT_SPEEDUP", "Point",
    "choose", "draw", "load", "mg_time_table", "mg_time_verdict", "plot_top1_vs_time", "points",
    "reach_speed_ups", "speed_check", "speed_ups", "time_to_reach",
]  # fmt: skip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MG_TIME_CSV = "study/results/video/mg_time.csv"
FIGURE = "study/results/video/figures/mg_time_top1_vs_wall_clock.png"
#: the same measurement at base batch 16 (``--grid mg_time16``): its CSV and figure
MG_TIME16_CSV = "study/results/video/mg_time16.csv"
FIGURE16 = "study/results/video/figures/mg_time16_top1_vs_wall_clock.png"
#: the base-batch-16 design on the 64-px, 16-frame task (``--grid mg_time64``)
MG_TIME64_CSV = "study/results/video/mg_time64.csv"
FIGURE64 = "study/results/video/figures/mg_time64_top1_vs_wall_clock.png"
#: the goal: multigrid this many times as fast as the plain schedule ...
GOAL_SPEEDUP = 2.0
MOONSHOT_SPEEDUP = 3.0
#: ... with the one-sided 95% lower bound of (multigrid - plain) reported top-1 at least this
GOAL_LOWER_BOUND = -1.0
HOLDOUT, REPORTED = "holdout_top1", "top1"

#: the schedules by the name part a cell carries, in the tables' order
SCHEDULES = {
    "plain": "plain step schedule",
    "multigrid-lrheld": "multigrid, long + short cycle, LR held",
    "multigrid-long-lrheld": "multigrid, long cycle alone, LR held",
    "multigrid-short": "multigrid, short cycle alone",
    "multigrid": "multigrid, long + short cycle, linear-rule LR",
    "multigrid-long": "multigrid, long cycle alone, linear-rule LR",
    "multigrid-long-keepframes": "multigrid, long cycle alone, every frame kept, linear-rule LR",
}
_NAME = re.compile(
    r"^\w+-bs\d+(?:-(multigrid(?:-long|-short)?(?:-lrheld)?(?:-keepframes)?))?(?:-ep([\d.]+)x)?(?:-lrstep)?(?:-s(\d+))?$")


@dataclass(frozen=True)
class Point:
    """One schedule at one epoch budget: its trained rows (one per seed)."""

    schedule: str
    factor: float
    rows: Tuple[dict, ...]

    @property
    def label(self) -> str:
        return f"{SCHEDULES[self.schedule]}, {self.factor:g}x the epochs"

    def by_seed(self, column: str) -> Dict[int, float]:
        """``column`` of each seed's row (seed 0 for a name without ``-sN``)."""
        return {seed_of(r["cell"]): float(r[column]) for r in self.rows if r.get(column) not in (None, "")}

    def values(self, column: str) -> List[float]:
        return list(self.by_seed(column).values())

    def summary(self, column: str) -> Optional[Summary]:
        values = self.values(column)
        return summarize(values) if values else None


def seed_of(cell: str) -> int:
    m = _NAME.match(cell)
    if m is None:
        raise ValueError(f"not an mg_time cell name: {cell!r}")
    return int(m.group(3) or 0)


def load(path: str = os.path.join(ROOT, MG_TIME_CSV)) -> List[dict]:
    """The CSV's rows ([] where it does not exist yet)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _trained(rows: Sequence[dict]) -> Tuple[List[dict], str]:
    """The trained rows (not diverged, with ``train_s`` and top-1) of the reference's machine
    class, and that class ("" where there is no reference row)."""
    trained = [r for r in rows if r.get("diverged") != "yes" and r.get("train_s") and r.get(REPORTED)]
    reference = [r for r in trained if _key(r["cell"]) == ("plain", 1.0)]
    cls = machine_class(reference[0].get("device", "")) if reference else ""
    return [r for r in trained if machine_class(r.get("device", "")) == cls], cls


def _probes(row: dict) -> Optional[Tuple[float, float]]:
    lo, hi = row.get("probe_ms_min"), row.get("probe_ms_max")
    return (float(lo), float(hi)) if lo not in (None, "") and hi not in (None, "") else None


def speed_check(rows: Sequence[dict]) -> Tuple[Optional[float], List[str], List[str]]:
    """Among the trained rows of the reference's class: the median of the reference rows'
    probes (ms; None where none has one), the cells with a probe more than a factor
    ``PROBE_FACTOR`` above or below it and the cells without a probe: both left out."""
    trained, _ = _trained(rows)
    ref_probes = [v for r in trained if _key(r["cell"]) == ("plain", 1.0) and _probes(r) for v in _probes(r)]
    median = statistics.median(ref_probes) if ref_probes else None
    off, missing = [], []
    for r in trained:
        probes = _probes(r)
        if probes is None or median is None:
            missing.append(r["cell"])
        elif probes[0] < median / PROBE_FACTOR or probes[1] > median * PROBE_FACTOR:
            off.append(r["cell"])
    return median, off, missing


def points(rows: Sequence[dict]) -> Tuple[Dict[Tuple[str, float], Point], str]:
    """The trained rows (not diverged, with ``train_s`` and top-1) of the reference's machine
    class at the reference's speed (:func:`speed_check`) by ``(schedule, epochs factor)``, and
    that class ("" where there is no reference row yet)."""
    trained, cls = _trained(rows)
    _, off, missing = speed_check(rows)
    groups: Dict[Tuple[str, float], List[dict]] = {}
    for r in trained:
        if r["cell"] not in off and r["cell"] not in missing:
            groups.setdefault(_key(r["cell"]), []).append(r)
    order = {s: i for i, s in enumerate(SCHEDULES)}
    keys = sorted(groups, key=lambda k: (order[k[0]], k[1]))
    return {k: Point(k[0], k[1], tuple(groups[k])) for k in keys}, cls


def _key(cell: str) -> Tuple[str, float]:
    m = _NAME.match(cell)
    if m is None:
        raise ValueError(f"not an mg_time cell name: {cell!r}")
    return m.group(1) or "plain", float(m.group(2) or 1.0)


def speed_ups(point: Point, reference: Point) -> List[float]:
    """The reference's ``train_s`` over the point's, for each seed both have."""
    mine, ref = point.by_seed("train_s"), reference.by_seed("train_s")
    return [ref[s] / mine[s] for s in sorted(mine) if s in ref]


def time_to_reach(curve: Sequence[Tuple[float, float]], target: float) -> Optional[Tuple[float, bool]]:
    """Where a seed's curve, ``(train_s, top-1)`` points in order of time, first reaches
    ``target`` (linear between points): ``(seconds, False)``; ``(first point's seconds,
    True)`` where the first point is already at or above it (reached by then); None where
    no point reaches it."""
    if not curve:
        return None
    if curve[0][1] >= target:
        return curve[0][0], True
    for (t0, a0), (t1, a1) in zip(curve, curve[1:]):
        if a0 < target <= a1:
            return t0 + (target - a0) * (t1 - t0) / (a1 - a0), False
    return None


def reach_speed_ups(schedule: str, pts: Dict[Tuple[str, float], Point], target: float
                    ) -> Dict[int, Optional[Tuple[float, bool]]]:  # fmt: skip
    """Per seed of the reference: the speed-up of ``schedule`` to reach ``target`` reported
    top-1 (the reference seed's ``train_s`` over :func:`time_to_reach` of that seed's curve
    of ``schedule``) with its "at least" mark; None where that curve does not reach it."""
    reference = pts[("plain", 1.0)].by_seed("train_s")
    mine = [p for (s, _), p in pts.items() if s == schedule]
    out: Dict[int, Optional[Tuple[float, bool]]] = {}
    for seed, ref_s in sorted(reference.items()):
        curve = sorted((p.by_seed("train_s")[seed], p.by_seed(REPORTED)[seed]) for p in mine
                       if seed in p.by_seed("train_s") and seed in p.by_seed(REPORTED))  # fmt: skip
        if not curve:
            continue
        reached = time_to_reach(curve, target)
        out[seed] = None if reached is None else (ref_s / reached[0], reached[1])
    return out


def _speed_note(rows: Sequence[dict], lead: str) -> str:
    """What the speed probe did: the reference's median probe and the rows it left out
    ("" where there are no trained rows); ``lead`` joins it to the sentence before
    (" (" closes with ")")."""
    trained, _ = _trained(rows)
    if not trained:
        return ""
    median, off, missing = speed_check(rows)
    parts = []
    if median is not None:
        kept = [v for r in trained if r["cell"] not in off and r["cell"] not in missing for v in _probes(r)]
        parts.append(f"the reference's machine-speed probe {fmt(median, 1)} ms (the rows compared: "
                     f"{fmt(min(kept), 1)} to {fmt(max(kept), 1)} ms)")  # fmt: skip
    if off:
        parts.append(f"left out at another machine speed (a probe beyond a factor {PROBE_FACTOR:g}): "
                     + ", ".join(f"`{c}`" for c in off))  # fmt: skip
    if missing:
        parts.append("left out without a speed probe: " + ", ".join(f"`{c}`" for c in missing))
    untimed = [r["cell"] for r in rows if r.get("diverged") != "yes" and r.get(REPORTED) and not r.get("train_s")]
    if untimed:
        parts.append("left out without a training time (an invocation killed before it was recorded): "
                     + ", ".join(f"`{c}`" for c in untimed))  # fmt: skip
    if not parts:
        return ""
    return lead + "; ".join(parts) + (")" if lead == " (" else "")


def _ms(s: Optional[Summary], digits: int = 2) -> str:
    if s is None:
        return "-"
    return f"{fmt(s.mean, digits)} ± {fmt(s.sd, digits)}" if s.sd is not None else fmt(s.mean, digits)


def _ratio_text(ratios: Sequence[float]) -> str:
    if not ratios:
        return "-"
    s = summarize(ratios)
    return f"{_ms(s)}x (" + ", ".join(fmt(r) for r in ratios) + ")"


def mg_time_table(rows: Sequence[dict]) -> str:
    """Every point against the plain schedule at 1x: n, training seconds, speed-up, both
    splits' top-1, the reported difference with Welch's 95% interval and lower bound, and
    the goal's mark; then each multigrid schedule's speed-up to the reference's top-1."""
    pts, cls = points(rows)
    ref = pts.get(("plain", 1.0))
    if ref is None:
        return "(no plain-schedule row of this grid yet" + _speed_note(rows, "; ") + ")"
    head = ["schedule, epochs", "n", "training s", "speed-up (per seed)", "held-out top-1",
            "reported top-1", "reported minus plain 1x [95%]", "lower bound", "goal"]  # fmt: skip
    lines = [f"Machine class {cls}; reference: the plain step schedule at 1x the epochs (n={len(ref.rows)})"
             + _speed_note(rows, "; ") + ".", "",
             "| " + " | ".join(head) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key, p in pts.items():
        ratios = speed_ups(p, ref)
        if key == ("plain", 1.0):
            diff, bound, goal = "-", "-", "(reference)"
        else:
            d = welch(p.values(REPORTED), ref.values(REPORTED))
            diff = d.interval()
            bound = "-" if d.lower_bound is None else fmt(d.lower_bound, sign=True)
            goal = _goal_mark(p, ratios, d.lower_bound)
        lines.append(f"| {p.label} | {len(p.rows)} | {_ms(p.summary('train_s'), 0)} | {_ratio_text(ratios)} | "
                     f"{_ms(p.summary(HOLDOUT))} | {_ms(p.summary(REPORTED))} | {diff} | {bound} | {goal} |")  # fmt: skip
    target = ref.summary(REPORTED).mean
    measured = [s for s in SCHEDULES if s != "plain" and any(k == s for k, _ in pts)]
    if not measured:
        return "\n".join(lines + ["", "(no multigrid row yet: no speed-up to the reference's top-1)"])
    lines += ["", f"Speed-up to reach the reference's reported top-1 ({fmt(target)}), per seed of the reference:", ""]
    for schedule in measured:
        reached = reach_speed_ups(schedule, pts, target)
        if not reached:
            lines.append(f"- {SCHEDULES[schedule]}: no seed of its shared with the reference's rows compared.")
            continue
        got = [v for v in reached.values() if v is not None]
        per_seed = ", ".join(f"s{seed}: " + ("not reached" if v is None else ("≥" if v[1] else "") + fmt(v[0]))
                             for seed, v in reached.items())  # fmt: skip
        text = f"{_ms(summarize([v[0] for v in got]))}x (n={len(got)})" if got else "not reached"
        lines.append(f"- {SCHEDULES[schedule]}: {text}; {per_seed}.")
    return "\n".join(lines)


def _goal_mark(p: Point, ratios: Sequence[float], lower_bound: Optional[float]) -> str:
    if p.schedule == "plain" or not ratios or lower_bound is None:
        return "-"
    speed = sum(ratios) / len(ratios)
    if lower_bound < GOAL_LOWER_BOUND or speed < GOAL_SPEEDUP:
        return "no"
    return "moonshot" if speed >= MOONSHOT_SPEEDUP else "goal"


def choose(pts: Dict[Tuple[str, float], Point], min_speed: float) -> Tuple[Optional[Point], int]:
    """The multigrid point the held-out split chooses among those with three seeds and a
    mean speed-up of at least ``min_speed``, and how many it chose among."""
    ref = pts[("plain", 1.0)]
    cands = [p for p in pts.values() if p.schedule != "plain" and len(p.values(HOLDOUT)) >= 3
             and speed_ups(p, ref) and sum(speed_ups(p, ref)) / len(speed_ups(p, ref)) >= min_speed]  # fmt: skip
    best = max(cands, key=lambda p: p.summary(HOLDOUT).mean) if cands else None
    return best, len(cands)


def mg_time_verdict(rows: Sequence[dict]) -> str:
    """The goal (>= :data:`GOAL_SPEEDUP` x as fast, lower bound >= :data:`GOAL_LOWER_BOUND`)
    and the moonshot (>= :data:`MOONSHOT_SPEEDUP` x) in generated sentences."""
    pts, cls = points(rows)
    ref = pts.get(("plain", 1.0))
    if ref is None:
        return "- No plain-schedule row of this grid yet" + _speed_note(rows, " (") + ": goal not met."
    searched = sum(1 for p in pts.values() if p.schedule != "plain")
    lines = [f"- Reference: the plain step schedule at 1x, reported top-1 {ref.summary(REPORTED).text()}, "
             f"training {_ms(ref.summary('train_s'), 0)} s ({cls}); {searched} multigrid "
             f"point{'s' * (searched != 1)} (schedule x epochs) measured{_speed_note(rows, '; ')}."]  # fmt: skip
    for label, speed in (("Goal", GOAL_SPEEDUP), ("Moonshot", MOONSHOT_SPEEDUP)):
        p, among = choose(pts, speed)
        if p is None:
            lines.append(f"- {label}: no multigrid point with three seeds is {speed:g}x as fast yet: not met.")
            continue
        ratios = speed_ups(p, ref)
        d = welch(p.values(REPORTED), ref.values(REPORTED))
        met = d.lower_bound is not None and d.lower_bound >= GOAL_LOWER_BOUND
        bound = "n/a" if d.lower_bound is None else fmt(d.lower_bound, sign=True)
        lines.append(f"- {label} (>= {speed:g}x as fast, lower bound >= {fmt(GOAL_LOWER_BOUND, 1, sign=True)}): "
                     f"the held-out split chooses {p.label} among {among}, {_ratio_text(ratios)} as fast; "
                     f"reported top-1 minus the reference {d.interval()}, lower bound {bound}: "
                     f"**{'met' if met else 'not met'}**.")  # fmt: skip
    return "\n".join(lines)


def plot_top1_vs_time(rows: Sequence[dict], path: str, title: str = "") -> Optional[str]:
    """Reported top-1 against training wall clock, one curve per schedule through its
    budgets' means (bars: the sample SD on both axes; dots: the seeds), with the reference's
    top-1 and its time divided by the goal's and the moonshot's speed-ups; None where there
    is no reference row yet."""
    from largedet.utils.run_curves import pyplot

    pts, cls = points(rows)
    ref = pts.get(("plain", 1.0))
    if ref is None:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for i, schedule in enumerate(SCHEDULES):
        mine = [p for (s, _), p in pts.items() if s == schedule]
        if not mine:
            continue
        color = f"C{i}"
        xs = [p.summary("train_s") for p in mine]
        ys = [p.summary(REPORTED) for p in mine]
        ax.errorbar([x.mean for x in xs], [y.mean for y in ys], xerr=[x.sd or 0 for x in xs],
                    yerr=[y.sd or 0 for y in ys], fmt="-o", color=color, capsize=3, label=SCHEDULES[schedule])  # fmt: skip
        for p in mine:
            t, a = p.by_seed("train_s"), p.by_seed(REPORTED)
            ax.plot([t[s] for s in t if s in a], [a[s] for s in t if s in a], ".", color=color, alpha=0.35)
            ax.annotate(f"{p.factor:g}x", (p.summary("train_s").mean, p.summary(REPORTED).mean), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))  # fmt: skip
    ref_t, ref_a = ref.summary("train_s").mean, ref.summary(REPORTED).mean
    ax.axhline(ref_a, color="0.4", lw=1, ls="--", label="plain 1x top-1")
    ax.axhline(ref_a + GOAL_LOWER_BOUND, color="0.6", lw=1, ls=":", label="plain 1x - 1 top-1")
    for speed in (GOAL_SPEEDUP, MOONSHOT_SPEEDUP):
        ax.axvline(ref_t / speed, color="tab:green", lw=1, ls=":", alpha=0.7)
        ax.annotate(f"{speed:g}x", (ref_t / speed, ax.get_ylim()[0]), fontsize=7, color="tab:green",
                    textcoords="offset points", xytext=(3, 3))  # fmt: skip
    ax.set_xlabel(f"training wall clock, s (evaluation left out; {cls})")
    ax.set_ylabel("reported top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "Multigrid's time to accuracy (mg_time grid)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw() -> List[str]:
    """The figure of each grid's CSV (base batch 128, base batch 16, the 64-px task), where it has a
    reference row."""
    paths = [plot_top1_vs_time(load(), os.path.join(ROOT, FIGURE)),
             plot_top1_vs_time(load(os.path.join(ROOT, MG_TIME16_CSV)), os.path.join(ROOT, FIGURE16),
                               "Multigrid's time to accuracy at base batch 16 (mg_time16 grid)"),
             plot_top1_vs_time(load(os.path.join(ROOT, MG_TIME64_CSV)), os.path.join(ROOT, FIGURE64),
                               "Multigrid's time to accuracy, 64 px x 16 frames (mg_time64 grid)")]  # fmt: skip
    return [p for p in paths if p]


#: generated blocks by name
BLOCKS: Dict[str, Callable[[], str]] = {
    "mg-time-table": lambda: mg_time_table(load()),
    "mg-time-verdict": lambda: mg_time_verdict(load()),
    "mg-time16-table": lambda: mg_time_table(load(os.path.join(ROOT, MG_TIME16_CSV))),
    "mg-time16-verdict": lambda: mg_time_verdict(load(os.path.join(ROOT, MG_TIME16_CSV))),
    "mg-time64-table": lambda: mg_time_table(load(os.path.join(ROOT, MG_TIME64_CSV))),
    "mg-time64-verdict": lambda: mg_time_verdict(load(os.path.join(ROOT, MG_TIME64_CSV))),
}
