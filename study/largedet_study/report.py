"""The studies' numbers in the docs, generated from their CSVs.

Result tables, cited numbers and the verdict sentences of README.md, docs/ and
projects/video/README.md, and the measured lines of the configs' comments, are written by
``python study/study_report.py`` between markers, and its ``--check`` (run by the test
suite) fails where a file differs from what the CSVs give:

* a block, Markdown: ``<!-- BEGIN generated NAME -->`` ... ``<!-- END generated NAME -->``;
  YAML (comment lines): ``# BEGIN generated NAME`` ... ``# END generated NAME``; NAME is a
  key of :data:`BLOCKS`;
* a number inside Markdown prose: ``<!--v KEY-->83.17<!--/v-->`` (the comments do not
  render), KEY as :func:`value` reads it.

Seeds of a cell are its rows whose names differ only in a ``-sN`` suffix (the family).
Every comparison gives n on both sides, the spread (sample SD) and Welch's 95%
interval and one-sided 95% lower bound of the difference (:mod:`.stats`).
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .demo_report import BLOCKS as DEMO_BLOCKS
from .video_bench_report import BLOCKS as VIDEO_BENCH_BLOCKS
from .gpu_report import BLOCKS as GPU_BLOCKS
from .mg_time_report import BLOCKS as MG_TIME_BLOCKS
from .mg_time_profile import BLOCKS as MG_TIME_PROFILE_BLOCKS
from . import fairness
from .fairness import machine_class, welch
from .stats import Difference, Summary, claim, difference, fmt, summarize

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

__all__ = [
    "BLOCKS",
    "CSVS",
    "Family",
    "check",
    "comparisons",
    "families",
    "fill",
    "multigrid_pairs",
    "multigrid_table",
    "regime_baseline",
    "regime_goal",
    "regime_optimizers",
    "regime_rows",
    "seed_count",
    "value",
    "video_rows",
    "write",
]

#: the studies' CSVs by the short name a KEY uses
CSVS = {
    "regime": "study/results/batch_scaling_regime.csv",
    "regime_epyc": "study/results/batch_scaling_regime_epyc_calibration.csv",
    # the regime grid's rows on the 2-core Ice Lake Xeon VM (no AMX): a machine class of its own
    "regime_icelake": "study/results/batch_scaling_regime_icelake.csv",
    # the regime grid's cells rerun on the 2-core Xeon VM with AMX where the main CSV holds
    # them from another machine (a cell's name is done once per CSV)
    "regime_amx": "study/results/batch_scaling_regime_amx.csv",
    # the regime grid on a Zen 5 EPYC VM (EPYC-Zen5), a machine class of its own: both sides
    # of its verdicts tuned there
    "regime_zen5": "study/results/batch_scaling_regime_zen5.csv",
    "steps": "study/results/batch_scaling_steps.csv",
    "steps2000": "study/results/batch_scaling_steps_eval2000.csv",
    "short": "study/results/batch_scaling_cpu.csv",
    "video": "study/results/video/batch_study.csv",
    "video4k": "study/results/video/tsm4k_study.csv",
    # the tsm4k grid rerun on one Zen 5 EPYC VM (both sides tuned alike there): a machine
    # class of its own, kept apart from the rows above
    "video4k_zen5": "study/results/video/tsm4k_study_zen5.csv",
    # tsm4k's multigrid rows run before multigrid recomputed BN at the base shape whatever
    # TEST.PRECISE_BN.ENABLED says: tested with BN statistics mixed over the shapes trained on
    "video4k_before_bn_fix": "study/results/video/tsm4k_study_before_bn_fix.csv",
}
#: each CSV's (held-out column, reported column); None: no held-out split
SPLITS = {
    "regime": ("holdout_ap", "box_ap"),
    "regime_epyc": ("holdout_ap", "box_ap"),
    "regime_icelake": ("holdout_ap", "box_ap"),
    "regime_amx": ("holdout_ap", "box_ap"),
    "regime_zen5": ("holdout_ap", "box_ap"),
    "steps": ("holdout_ap", "box_ap"),
    "steps2000": ("holdout_ap", "box_ap"),
    "short": (None, "box_ap"),
    "video": (None, "top1"),
    "video4k": ("holdout_top1", "top1"),
    "video4k_zen5": ("holdout_top1", "top1"),
    "video4k_before_bn_fix": ("holdout_top1", "top1"),
}
#: the files that may hold markers
FILES = ("README.md", "docs", "projects/video/README.md", "configs", "projects/video/configs",
         "benchmarks/RESULTS.md")

_SEED = re.compile(r"-s\d+$")


#: a CSV whose cells were evaluated again on more images: its AP columns come from there
REEVALUATED = {"steps": "steps2000"}


def _read(name: str) -> List[dict]:
    path = os.path.join(ROOT, CSVS[name])
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if name in REEVALUATED:
        again = {r["cell"]: r for r in _read(REEVALUATED[name])}
        for row in rows:
            if row["cell"] in again:
                for column in ("holdout_ap", "box_ap"):
                    row[column] = again[row["cell"]][column]
    return rows


_WORDS = [
    (r"^ep([\d.]+)x$", "{}x the epochs"),
    (r"^wu([\d.]+)$", "warm-up {} epochs"),
    (r"^lrwsd$", "WSD LR"),
    (r"^lrcosine$", "cosine LR"),
    (r"^lrx([\d.]+)$", "LR x{}"),
    (r"^wd([\d.e-]+)$", "weight decay {}"),
    (r"^b2([\d.]+)$", "beta2 {}"),
    (r"^ema([\d.]+)$", "model EMA {}"),
    (r"^clip([\d.]+)$", "gradient clip {}"),
    (r"^T(\d+)$", "period T = {}"),
    (r"^agvm$", "AGVM"),
    (r"^multigrid$", "multigrid"),
    (r"^lrheld$", "its LR held at the base shape's"),
    (r"^short$", "the short cycle alone"),
    (r"^long$", "the long cycle alone"),
    (r"^lrstep$", "step LR"),
]


def describe(name: str) -> str:
    """What a family's name says, in words: ``pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01`` ->
    "PMD-LAMB, batch 256, 1.4x the epochs, WSD LR, weight decay 0.01"."""
    optimizers = {"sgd": "SGD", "pmd_lamb": "PMD-LAMB", "lamb": "LAMB", "adamw": "AdamW",
                  "lars": "LARS", "tsn": "TSN"}  # fmt: skip
    parts = name.split("-")
    words = []
    for i, part in enumerate(parts):
        if part in optimizers:
            words.append(optimizers[part])
        elif part.startswith("bs") and part[2:].isdigit():
            words.append(f"batch {part[2:]}")
        elif part.startswith("ramp"):
            stages = re.findall(r"(\d+)e([\d.]+)", "-".join(parts[i:]))
            words.append("batch ramp: " + ", ".join(f"{b} to epoch {e}" for b, e in stages))
            break
        elif part == "cosine" and i and parts[i - 1].startswith("T"):
            continue
        else:
            for pattern, text in _WORDS:
                m = re.match(pattern, part)
                if m:
                    words.append(text.format(*m.groups()))
                    break
            else:
                words.append(part)
    return ", ".join(words)


def _machine(device: str) -> str:
    return machine_class(device)


@dataclass(frozen=True)
class Family:
    """A cell and its other seeds: the rows of one recipe."""

    name: str
    rows: Tuple[dict, ...]

    @property
    def batch(self) -> int:
        return int(self.rows[0]["batch"])

    @property
    def trained(self) -> Tuple[dict, ...]:
        return tuple(r for r in self.rows if r.get("diverged") != "yes")

    def values(self, column: str) -> List[float]:
        return [float(r[column]) for r in self.trained if r.get(column) not in (None, "")]

    def summary(self, column: str) -> Optional[Summary]:
        values = self.values(column)
        return summarize(values) if values else None

    @property
    def machines(self) -> str:
        return "/".join(dict.fromkeys(_machine(r.get("device", "")) for r in self.rows))


def families(csv_name: str) -> Dict[str, Family]:
    """The families of a CSV, in the order their first row appears."""
    groups: Dict[str, List[dict]] = {}
    for row in _read(csv_name):
        groups.setdefault(_SEED.sub("", row["cell"]), []).append(row)
    return {name: Family(name, tuple(rows)) for name, rows in groups.items()}


#: a KEY's CSV name for the regime grid's rows of all its CSVs together (:func:`regime_families_all`)
REGIME_ALL = "regime_all"


def class_baseline(cls: str) -> Optional[Family]:
    """The regime grid's baseline on machine class ``cls``: its batch-16 family whose seed-0
    row is best on the held-out split, over the rows of that class in all the grid's CSVs
    (:func:`largedet_study.fairness.per_class`); None where the class has no batch-16 row."""
    for c, _mine, base in fairness.per_class(regime_families_all()):
        if c == cls:
            return base
    return None


def _family(csv_name: str, name: str) -> Family:
    """A family by name; ``baseline``: the grid's strongest batch-16 one; ``=CELL``: the one
    row named CELL (one seed of a family); ``NAME@CLASS``: its rows of one machine class
    (:func:`largedet_study.fairness.machine_class`). With ``csv_name`` ``regime_all`` the
    rows are the regime grid's CSVs together, and ``baseline@CLASS`` is that class's own
    baseline (:func:`class_baseline`)."""
    if csv_name == REGIME_ALL and name.startswith("baseline@"):
        cls = name.split("@", 1)[1]
        base = class_baseline(cls)
        if base is None:
            raise KeyError(f"regime grid: no batch-16 row on machine class {cls!r}")
        return base
    if "@" in name:
        name, cls = name.split("@", 1)
        fam = _family(csv_name, name)
        return Family(fam.name, tuple(r for r in fam.rows if machine_class(r.get("device", "")) == cls))
    if name.startswith("="):
        every = [r for f in regime_families_all().values() for r in f.rows] if csv_name == REGIME_ALL else _read(csv_name)
        rows = tuple(r for r in every if r["cell"] == name[1:])
        if not rows:
            raise KeyError(f"{CSVS[csv_name]}: no cell {name[1:]!r}")
        return Family(name[1:], rows)
    fams = regime_families_all() if csv_name == REGIME_ALL else families(csv_name)
    if name == "baseline":
        return regime_baseline() if csv_name.startswith("regime") else video_baseline(csv_name)
    if name not in fams:
        raise KeyError(f"{CSVS.get(csv_name, 'the regime grid')}: no cell family {name!r}")
    return fams[name]


def _best_batch16(fams: Dict[str, Family], holdout: str) -> Optional[Family]:
    """The batch-16 family with the highest held-out mean, whatever its number of seeds: the
    strongest reference so far (a check that needs three seeds asks for them on it)."""
    cands = [f for f in fams.values() if f.batch == 16 and f.summary(holdout) is not None
             and not f.name.startswith("tsn")]  # fmt: skip
    return max(cands, key=lambda f: f.summary(holdout).mean) if cands else None


def regime_baseline() -> Family:
    """The regime grid's strongest batch-16 baseline: the best held-out mean of its batch-16
    recipes."""
    return _best_batch16(families("regime"), "holdout_ap")


def video_baseline(csv_name: str = "video4k") -> Optional[Family]:
    """The video grid's strongest batch-16 baseline, chosen as the regime grid's is: the
    batch-16 family whose seed-0 row is best on the held-out split (the reported one where
    the grid has none), whatever its other seeds (the protocol: seed 0 per candidate
    chooses, then three seeds of the chosen one)."""
    holdout, reported = SPLITS[csv_name]
    cands = [f for f in families(csv_name).values() if f.batch == 16 and not f.name.startswith("tsn")]
    return fairness.choose(cands, holdout or reported)


# --- inline values ------------------------------------------------------------------------


def value(key: str) -> str:
    """The text of an inline KEY:

    * ``CSV/FAMILY/STAT/COLUMN``: STAT one of ``mean``, ``sd``, ``n``, ``min``, ``max``,
      ``row`` (the family's one row); FAMILY ``baseline`` is the strongest batch-16 baseline;
    * ``CSV/A~B/STAT/COLUMN``: mean(A) - mean(B) (B may be in another CSV: ``A~CSV2:B``),
      STAT one of ``diff``, ``low``, ``high``, ``lb`` (Welch's 95% interval's ends and the
      one-sided 95% lower bound), ``ci`` (``+0.07 [-0.46, +0.59]``);
    * ``CSV/FAMILY/name``: the family's cell name as run (``baseline`` resolved);
    * CSV ``regime_all``: the regime grid's CSVs together, one machine class by
      ``FAMILY@CLASS`` and ``baseline@CLASS`` (:func:`_family`), e.g.
      ``regime_all/pmd_lamb-bs256-lrwsd-wd0.01@Xeon-AMX~baseline@Xeon-AMX/ci/holdout_ap``.
    """
    parts = key.split("/")
    if len(parts) == 3 and parts[2] == "name":
        return _family(parts[0], parts[1]).name
    if len(parts) != 4:
        raise KeyError(f"inline value {key!r}: expected CSV/FAMILY/STAT/COLUMN")
    csv_name, fam, stat, column = parts
    if csv_name not in CSVS and csv_name != REGIME_ALL:
        raise KeyError(f"inline value {key!r}: unknown CSV {csv_name!r}; one of {sorted(CSVS) + [REGIME_ALL]}")
    if "~" in fam:
        a_name, b_name = fam.split("~")
        b_csv, _, b_name = b_name.rpartition(":")
        a = _family(csv_name, a_name)
        b = _family(b_csv or csv_name, b_name)
        d = welch(a.values(column), b.values(column))
        if stat == "ci":
            return d.interval()
        number = {"diff": d.diff, "low": d.low, "high": d.high, "lb": d.lower_bound}[stat]
        return "n/a" if number is None else f"{fmt(number, sign=True)}"
    family = _family(csv_name, fam)
    values = family.values(column)
    if stat == "n":
        return str(len(values))
    if stat == "row":
        if len(family.rows) != 1:
            raise KeyError(f"inline value {key!r}: {fam} has {len(family.rows)} rows, not one")
        return family.rows[0][column]
    if not values:
        raise KeyError(f"inline value {key!r}: no values")
    s = summarize(values)
    number = {"mean": s.mean, "sd": s.sd, "min": min(values), "max": max(values)}[stat]
    return "n/a" if number is None else f"{fmt(number)}"


# --- tables -------------------------------------------------------------------------------


def _ms(s: Optional[Summary]) -> str:
    if s is None:
        return "-"
    return f"{fmt(s.mean)} ± {fmt(s.sd)}" if s.sd is not None else f"{fmt(s.mean)}"


def _diff_cells(d: Difference) -> List[str]:
    if d.low is None:
        return [f"{fmt(d.diff, sign=True)}", "-", "-"]
    return [f"{fmt(d.diff, sign=True)}", f"[{fmt(d.low, sign=True)}, {fmt(d.high, sign=True)}]", f"{fmt(d.lower_bound, sign=True)}"]


def _steps(f: Family) -> str:
    its = sorted({int(r["iterations"]) for r in f.rows if r.get("iterations")})
    return "/".join(f"{i:,}" for i in its)


def cells_table(csv_name: str, extra: Sequence[str] = ()) -> str:
    """Every family of a CSV: batch, share of the data, steps, n, the held-out and reported
    means ± sample SD, the final training loss's mean, the machine."""
    holdout, reported = SPLITS[csv_name]
    fams = [(f"`{name}`", f) for name, f in families(csv_name).items()] + [
        (f"`{name}` ({_LABELS.get(m, m)})", f) for m in extra for name, f in families(m).items()
    ]
    metric = "AP" if reported != "top1" else "top-1"
    head = ["cell (seeds as -sN)", "what", "steps", "n"]
    head += ([f"held-out {metric}"] if holdout else []) + [f"reported {metric}", "final loss", "machine"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- | " + " | ".join("---:" for _ in head[2:-1]) + " | --- |"]
    for label, f in fams:
        n = len(f.trained)
        div = len(f.rows) - n
        losses = [float(r["final_loss"]) for r in f.rows if r.get("final_loss")]
        losses = [v for v in losses if v == v]  # a diverged run may write NaN
        row = [label, describe(f.name), _steps(f), f"{n}" + (f" (+{div} diverged)" if div else "")]
        if holdout:
            row.append(_ms(f.summary(holdout)))
        loss = f"{sum(losses) / len(losses):.3f}" if losses else "-"
        row += [_ms(f.summary(reported)), loss, f.machines]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _splits(csv_name: str) -> List[Tuple[str, str]]:
    holdout, reported = SPLITS[csv_name]
    return [(holdout, "held-out"), (reported, "reported")] if holdout else [(reported, "reported")]


def comparisons(baseline: Family, rows: Sequence[Tuple[str, Family]], csv_name: str
                ) -> List[Tuple[str, Family, Dict[str, Optional[Difference]]]]:  # fmt: skip
    """``rows`` (label, family) against ``baseline``: each with its Welch
    :class:`~largedet_study.stats.Difference` per split name ("held-out", "reported"; None
    where a side has no value). What :func:`comparison_table` prints and
    :func:`largedet_study.interval_plot.plot_intervals` draws."""
    out = []
    for label, f in rows:
        diffs: Dict[str, Optional[Difference]] = {}
        for column, split in _splits(csv_name):
            a, b = f.values(column), baseline.values(column)
            diffs[split] = welch(a, b) if a and b else None
        out.append((label, f, diffs))
    return out


def comparison_table(csv_name: str, baseline: Family, rows: Sequence[Tuple[str, Family]]) -> str:
    """``rows`` (label, family) against ``baseline``: n, the difference of the means on each
    split with its Welch 95% interval, and the one-sided 95% lower bound."""
    splits = _splits(csv_name)
    head = [f"against `{baseline.name}` ({baseline.machines})", "n", "machine"]
    for _, split in splits:
        head += [f"{split}: diff [95% interval]", "lower bound (pooled)"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: | --- | " + " | ".join("---:" for _ in head[3:]) + " |"]
    for label, f, diffs in comparisons(baseline, rows, csv_name):
        cells = [label, f"{len(f.trained)}/{len(baseline.trained)}", f.machines]
        for column, split in splits:
            d = diffs[split]
            if d is None:
                cells += ["-", "-"]
                continue
            pooled = difference(f.values(column), baseline.values(column)).lower_bound
            bound = "-" if d.lower_bound is None else fmt(d.lower_bound, sign=True)
            cells += [d.interval(), bound + ("" if pooled is None else f" ({fmt(pooled, sign=True)})")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: how a table names the rows of a second CSV of the same grid
_LABELS = {"regime_epyc": "EPYC calibration"}


def _large_families(csv_name: str) -> List[Tuple[str, Family]]:
    out = []
    for name, f in families(csv_name).items():
        if f.batch > 16 and f.trained:
            out.append((f"`{name}`" + (f" ({_LABELS[csv_name]})" if csv_name in _LABELS else ""), f))
    return out


def regime_classes() -> List[Tuple[str, Dict[str, Family], Family]]:
    """The regime grid's machine classes that have a batch-16 row, each with its families (the
    rows of every regime CSV on that class) and its own baseline
    (:func:`largedet_study.fairness.per_class`), the class with the most rows first."""
    classes = [(cls, mine, base) for cls, mine, base in fairness.per_class(regime_families_all()) if base is not None]
    return sorted(classes, key=lambda c: -sum(len(f.rows) for f in c[1].values()))


def regime_rows(cls: Optional[str] = None) -> Tuple[Family, List[Tuple[str, Family]]]:
    """One machine class's baseline and the rows compared with it, all of that class: its
    other batch-16 recipes, then every large-batch family. ``cls`` None: the class with the
    most rows."""
    classes = regime_classes()
    cls, mine, base = next((c for c in classes if c[0] == cls), classes[0]) if cls else classes[0]
    others = [(f"`{n}` (batch 16)", f) for n, f in mine.items() if f.batch == 16 and f.name != base.name and f.trained]
    large = [(f"`{n}`", f) for n, f in mine.items() if f.batch > 16 and f.trained]
    return base, others + large


def regime_comparison() -> str:
    """One table per machine class: its rows against its own baseline."""
    tables = []
    classes = regime_classes()
    for cls, _mine, _base in classes:
        base, rows = regime_rows(cls)
        tables.append(f"**{cls}**\n\n" + comparison_table("regime", base, rows))
    compared = {c for c, _m, _b in classes}
    alone = [cls for cls, _m, _b in fairness.per_class(regime_families_all()) if cls not in compared]
    if alone:
        tables.append("Not compared (no batch-16 row on that machine class): "
                      + ", ".join(alone) + "; their rows are in the cells table below.")
    return "\n\n".join(tables)


#: the regime grid's CSVs: its own rows, the EPYC calibration's, the Ice Lake VM's, the
#: AMX Xeon's reruns
REGIME_CSVS = ("regime", "regime_epyc", "regime_icelake", "regime_amx", "regime_zen5")


def regime_families_all() -> Dict[str, Family]:
    """The regime grid's families with the rows of every one of its CSVs (a family's rows
    may come from several machine classes: :mod:`largedet_study.fairness` keeps them apart)."""
    groups: Dict[str, List[dict]] = {}
    for csv_name in REGIME_CSVS:
        for row in _read(csv_name):
            groups.setdefault(_SEED.sub("", row["cell"]), []).append(row)
    return {name: Family(name, tuple(rows)) for name, rows in groups.items()}


def _epochs_factor(name: str) -> float:
    m = re.search(r"-ep([\d.]+)x", name)
    return float(m.group(1)) if m else 1.0


def regime_goal() -> bool:
    """Whether the regime grid meets its goal on one machine class by Welch's bound
    (:func:`largedet_study.fairness.goal_met`)."""
    return fairness.goal_met(regime_families_all())


def pending_batch16_cells() -> List[str]:
    """The regime grid's batch-16 cells (:func:`largedet_study.grid.build_grid`) with no row
    in its CSV: candidates for the baseline still to run."""
    from .grid import build_grid

    done = {r["cell"] for r in _read("regime")}
    return [c.name for c in build_grid("regime").cells if c.batch == 16 and c.name not in done]


def regime_verdict() -> str:
    """The regime grid's verdict, per machine class and epoch budget
    (:func:`largedet_study.fairness.verdict_text`), with the batch-16 cells still to run."""
    text = fairness.verdict_text(regime_families_all())
    pending = pending_batch16_cells()
    if pending:
        text += ("\n- Batch-16 cells of the grid without a row yet: "
                 f"{', '.join(f'`{n}`' for n in pending)}; each baseline is the best of those that ran.")  # fmt: skip
    return text


def regime_optimizers() -> str:
    """PMD-LAMB, LAMB and SGD at batch 256 against each machine class's strongest baseline
    (:func:`largedet_study.fairness.optimizer_table`)."""
    return fairness.optimizer_table(regime_families_all())


def video_choice(csv_name: str, min_batch: int, max_factor: float) -> Optional[Family]:
    """The recipe the held-out split chooses (the reported one where the grid has none) among
    the families at batch >= ``min_batch`` and <= ``max_factor`` x the epochs with three seeds
    or more, multigrid left out; None where there is none yet."""
    holdout, reported = SPLITS[csv_name]
    cands = [f for f in families(csv_name).values() if f.batch >= min_batch and "multigrid" not in f.name
             and _epochs_factor(f.name) <= max_factor and len(f.trained) >= 3]  # fmt: skip
    return max(cands, key=lambda f: f.summary(holdout or reported).mean) if cands else None


_LRX = re.compile(r"-lrx([\d.]+)")


def _lr_factor(name: str) -> float:
    m = _LRX.search(name)
    return float(m.group(1)) if m else 1.0


def _lr_sweep_text(fams: Dict[str, Family], chosen: Family) -> str:
    """``chosen``'s LR sweep: the factors of its rule's LR tried by the families that differ
    from it in ``-lrxF`` alone (each with its seed-0 row's held-out or reported top-1), and
    whether the chosen factor sits at an edge of them (its optimum then not bracketed)."""
    stem = _LRX.sub("", chosen.name)
    column = "holdout_top1" if any(r.get("holdout_top1") for r in chosen.rows) else "top1"
    tried = []
    for f in fams.values():
        if _LRX.sub("", f.name) == stem:
            seed0 = next((r for r in f.trained if r["cell"] == f.name and r.get(column)), None)
            tried.append((_lr_factor(f.name), seed0[column] if seed0 else "diverged" if f.rows else "-"))
    tried.sort()
    factors = [x for x, _ in tried]
    mine = _lr_factor(chosen.name)
    where = ("bracketed" if len(factors) >= 3 and factors[0] < mine < factors[-1]
             else "**at an edge of its sweep**")  # fmt: skip
    listed = ", ".join(f"x{x:g} {v}" for x, v in tried)
    split = "held-out" if column == "holdout_top1" else "reported"
    return f"`{chosen.name}` (x{mine:g}); tried {listed} (seed 0, {split} top-1): {where}"


def video_verdict(csv_name: str = "video4k") -> str:
    """The video grid's check in generated sentences: the batch-16 SGD baseline (>= 3 seeds,
    below 95% top-1 on >= 4096 reported videos); the recipe at batch >= 256 the held-out split
    chooses at <= 1.4x the epochs (>= 3 seeds) within 1.0 top-1 of it, with the one-sided 95%
    lower bound of the difference >= -2.0 (the goal); batch 1024 the same at <= 2x (moonshot)."""
    holdout, reported = SPLITS[csv_name]
    base = video_baseline(csv_name)
    if base is None:
        return "- No batch-16 baseline row yet."
    videos = min(int(r.get("val_videos") or 0) for r in base.rows)
    bs = base.summary(reported)
    text = [f"- Baseline `{base.name}`: reported top-1 {bs.text()} on {videos} videos"
            + (f", held-out {base.summary(holdout).text()}" if holdout else "") + "."]
    ok_base = len(base.trained) >= 3 and bs.mean < 95.0 and videos >= 4096
    if not ok_base:
        text.append("- The baseline does not yet meet the check's terms (>= 3 seeds, below 95%, >= 4096 videos).")

    verdicts = []
    for label, lo, factor in (("goal", 256, 1.4), ("moonshot", 1024, 2.0)):
        f = video_choice(csv_name, lo, factor)
        if f is None:
            text.append(f"- {label.capitalize()}: no recipe at batch >= {lo} and <= {factor:g}x the epochs has three seeds yet: not met.")
            verdicts.append(False)
            continue
        d = welch(f.values(reported), base.values(reported))
        met = ok_base and d.diff >= -1.0 and d.lower_bound is not None and d.lower_bound >= -2.0
        verdicts.append(met)
        text.append(f"- {label.capitalize()}: `{f.name}` minus the baseline, reported top-1 {claim(d, 1.0)}; "
                    f"the terms (a difference >= -1.0 and a lower bound >= -2.0): {fmt(d.diff, sign=True)} and "
                    f"{'n/a' if d.lower_bound is None else fmt(d.lower_bound, sign=True)}: "
                    f"**{'met' if met else 'not met'}**.")
    for side, f in (("batch 16", base), ("the goal's recipe", video_choice(csv_name, 256, 1.4))):
        if f is not None:
            text.append(f"- {side.capitalize()}'s LR: {_lr_sweep_text(families(csv_name), f)}.")
    small = [n for n, f in families(csv_name).items() if f.batch == 16 and not n.startswith("tsn")]
    large = [n for n, f in families(csv_name).items()
             if f.batch >= 256 and "multigrid" not in n and _epochs_factor(n) <= 1.4]  # fmt: skip
    swept = sorted({_lr_factor(n) for n in small}) if any(_LRX.search(n) for n in small) else []
    swept = [f"{x:g}" for x in swept]
    text.append(f"- Tuning: batch 16 tried {len(small)} recipe{'s' * (len(small) != 1)}"
                + (f" (LR x{', x'.join(swept)} of its rule's)" if swept else ", its LR not swept")
                + f"; batch >= 256 at <= 1.4x the epochs tried {len(large)}.")  # fmt: skip
    if multigrid_pairs(csv_name):
        text.append(multigrid_verdict(csv_name))
    return "\n".join(text)


def video_cells(csv_name: str) -> str:
    return cells_table(csv_name) if _read(csv_name) else "(no finished cell yet)"


def video_rows(csv_name: str) -> Tuple[Optional[Family], List[Tuple[str, Family]]]:
    """A video grid's baseline (None: no batch-16 row yet) and the rows compared with it."""
    base = video_baseline(csv_name)
    if base is None:
        return None, []
    rows = [(f"`{n}`", f) for n, f in families(csv_name).items()
            if n != base.name and f.trained and not n.startswith("tsn")]  # fmt: skip
    return base, rows


def video_comparison(csv_name: str) -> str:
    base, rows = video_rows(csv_name)
    if base is None:
        return "(no batch-16 baseline yet)"
    return comparison_table(csv_name, base, rows)


#: multigrid "trains" where its reported top-1 is above this share of the baseline's
MULTIGRID_TRAINS = 0.8


def multigrid_pairs(csv_name: str = "video4k") -> List[Tuple[Family, Optional[Family]]]:
    """Each multigrid family with its own row without multigrid at equal epochs: the family
    named with ``multigrid`` (and ``-lrheld``, ``-short`` or ``-long``) replaced by ``lrstep`` (the step schedule multigrid runs on);
    None where that row has not run."""
    fams = families(csv_name)
    return [(f, fams.get(re.sub(r"-multigrid(-lrheld|-short|-long)?", "", name) + "-lrstep"))
            for name, f in fams.items() if "-multigrid" in name]  # fmt: skip


def _seed_of(row: dict) -> str:
    m = _SEED.search(row["cell"])
    return m.group(0) if m else ""


def _train_seconds(fam: Family) -> Dict[str, float]:
    """A family's training seconds (``train_s``) by seed suffix, its trained rows that have one."""
    return {_seed_of(r): float(r["train_s"]) for r in fam.trained if r.get("train_s")}


def speed_ups(multigrid: Family, plain: Family) -> List[float]:
    """The training wall clock without multigrid over with it, seed by seed, for the seeds
    both families have (a ratio is never taken between different seeds)."""
    mine, theirs = _train_seconds(multigrid), _train_seconds(plain)
    return [theirs[s] / mine[s] for s in mine if s in theirs]


def multigrid_verdict(csv_name: str = "video4k") -> str:
    """The video check's multigrid line: among the multigrid families with two seeds or
    more whose row without multigrid has two too, the one with the best reported top-1; it
    trains where that top-1 is above :data:`MULTIGRID_TRAINS` of the baseline's, and its
    speed-up is stated seed by seed."""
    _, reported = SPLITS[csv_name]
    base = video_baseline(csv_name)
    pairs = [(mg, plain) for mg, plain in multigrid_pairs(csv_name)
             if plain is not None and len(mg.trained) >= 2 and len(plain.trained) >= 2 and speed_ups(mg, plain)]
    if base is None or not pairs:
        return "- Multigrid: no multigrid row and its row without multigrid have two seeds each yet: not met."
    mg, plain = max(pairs, key=lambda p: p[0].summary(reported).mean)
    share = mg.summary(reported).mean / base.summary(reported).mean
    ratios = speed_ups(mg, plain)
    d = welch(mg.values(reported), plain.values(reported))
    met = share > MULTIGRID_TRAINS
    return (f"- Multigrid: `{mg.name}` (n={len(mg.trained)}), reported top-1 {_ms(mg.summary(reported))}, "
            f"{100 * share:.0f}% of the baseline's (the bar: above {100 * MULTIGRID_TRAINS:.0f}%); "
            f"against `{plain.name}` (n={len(plain.trained)}) {d.interval()}, its training "
            f"{fmt(sum(ratios) / len(ratios))}x as fast (per seed {', '.join(fmt(r) for r in ratios)}): "
            f"**{'met' if met else 'not met'}**.")


def multigrid_table(csv_name: str = "video4k") -> str:
    """Multigrid against its own row without multigrid (:func:`multigrid_pairs`): n, top-1
    on both splits (mean ± SD), the reported difference with its Welch 95% interval, the
    speed-up of the training wall clock (``train_s``: the run less its evaluation; the row
    without over multigrid, seed by seed where both have the seed), and whether multigrid
    trains (reported top-1 above :data:`MULTIGRID_TRAINS` of the baseline's)."""
    holdout, reported = SPLITS[csv_name]
    base = video_baseline(csv_name)
    pairs = multigrid_pairs(csv_name)
    if not pairs:
        return "(no multigrid row yet)"
    head = ["multigrid / without", "n", "held-out top-1", "reported top-1",
            "reported: diff [95% interval]", "training, s", "speed-up (per seed)", "trains"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for mg, plain in pairs:
        n = f"{len(mg.trained)}/{len(plain.trained) if plain else 0}"
        if plain is not None:
            ho = f"{_ms(mg.summary(holdout))} / {_ms(plain.summary(holdout))}"
            rep = f"{_ms(mg.summary(reported))} / {_ms(plain.summary(reported))}"
            d = welch(mg.values(reported), plain.values(reported)) if plain.trained and mg.trained else None
            walls, pwalls = _train_seconds(mg), _train_seconds(plain)
            ratios = speed_ups(mg, plain)
            wall = (f"{fmt(summarize(list(walls.values())).mean, 0)} / "
                    f"{fmt(summarize(list(pwalls.values())).mean, 0)}") if walls and pwalls else "-"
            speed = (f"{fmt(sum(ratios) / len(ratios))}x ({', '.join(fmt(r) for r in ratios)})"
                     if ratios else "-")  # fmt: skip
        else:
            ho, rep = _ms(mg.summary(holdout)) + " / -", _ms(mg.summary(reported)) + " / -"
            d, wall, speed = None, "-", "-"
        diff = "-" if d is None else d.interval()
        trains = "-"
        if base is not None and mg.trained:
            share = mg.summary(reported).mean / base.summary(reported).mean
            trains = f"{'yes' if share > MULTIGRID_TRAINS else 'no'} ({100 * share:.0f}% of `{base.name}`)"
        label = f"`{mg.name}` / `{plain.name if plain else '-'}`"
        lines.append(f"| {label} | {n} | {ho} | {rep} | {diff} | {wall} | {speed} | {trains} |")
    return "\n".join(lines)


def _row_against(label: str, fam: Optional[Family], base: Family, splits: Sequence[str], share: str,
                 epochs: str) -> Optional[str]:  # fmt: skip
    if fam is None or not fam.trained:
        return None
    cells = []
    for column in splits:
        if column is None:
            cells.append("-")
            continue
        d = welch(fam.values(column), base.values(column))
        cells.append(d.interval())
    return (f"| {label} | {share} | {epochs} | {len(fam.trained)} / {len(base.trained)} | "
            + " | ".join(cells) + f" | {fam.machines} / {base.machines} |")  # fmt: skip


def seed_count(n: int) -> str:
    """"1 seed", "3 seeds"."""
    return f"{n} seed{'s' * (n != 1)}"


def results_summary() -> str:
    """The README's results table: the large-batch recipes minus the strongest batch-16
    baseline of their grid, n on each side and Welch's 95% interval, on both splits. A
    detection row compares rows of one machine class (the regime grid's CSVs together, each
    class against its own strongest batch-16 recipe, chosen by seed 0 on the held-out split)."""
    lines = ["| study | batch / N | epochs | n (large / 16) | held-out: diff [95% interval] "
             "| reported: diff [95% interval] | machines |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    rows = [
        ("detection, PMD-LAMB (configs' recipe)", "pmd_lamb-bs256-lrwsd-wd0.01", "256 / 24,576 = 1.0%", "1.0x"),
        ("detection, PMD-LAMB (configs' recipe)", "pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01", "256 / 24,576 = 1.0%", "1.4x"),
        ("detection, PMD-LAMB (configs' recipe)", "pmd_lamb-bs256-ep2x-lrwsd-wd0.01", "256 / 24,576 = 1.0%", "2x"),
        ("detection, PMD-LAMB (configs' recipe)", "pmd_lamb-bs1024-lrwsd-wd0.01", "1024 / 24,576 = 4.2%", "1.0x"),
        ("detection, PMD-LAMB (configs' recipe)", "pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01", "1024 / 24,576 = 4.2%", "1.4x"),
    ]
    baselines = []
    for cls, mine, base in fairness.per_class(regime_families_all()):
        if base is None:
            continue
        added = 0
        for label, name, share, epochs in rows:
            line = _row_against(label, mine.get(name), base, ("holdout_ap", "box_ap"), share, epochs)
            if line:
                lines.append(line)
                added += 1
        if added:
            baselines.append(f"detection on {cls}: `{base.name}` ({seed_count(len(base.trained))})")
    for csv_name, label in (("video4k", "video, TSM, 4096 reported videos"),
                            ("video4k_zen5", "video, TSM, 4096 reported videos, both sides tuned"),
                            ("video", "video, TSM, 1024 videos (first grid)")):  # fmt: skip
        vbase = video_baseline(csv_name)
        if vbase is None:
            continue
        vf = families(csv_name)
        for opt in ("sgd", "pmd_lamb"):
            for name, f in vf.items():
                if name.startswith(f"{opt}-bs256") and "multigrid" not in name and len(f.trained) >= 2:
                    epochs = f"{_epochs_factor(name):g}x"
                    line = _row_against(f"{label}, {describe(opt)}", f, vbase, SPLITS[csv_name],
                                        "256 / 4,096 = 6.25%", epochs)  # fmt: skip
                    if line:
                        lines.append(line)
    for csv_name in ("video4k", "video4k_zen5", "video"):
        vbase = video_baseline(csv_name)
        if vbase is not None:
            baselines.append(f"video ({CSVS[csv_name].rsplit('/', 1)[-1]}): `{vbase.name}` ({seed_count(len(vbase.trained))})")
    return "\n".join(lines) + "\n\nDifferences are the large batch minus the baseline (" + "; ".join(baselines) + ")."


def _wrap(text: str, width: int = 88) -> str:
    import textwrap

    # a row citation "regime: <cell>" stays on one line
    glued = text.replace("regime: ", "regime:\u00a0")
    lines = textwrap.wrap(glued, width=width, break_on_hyphens=False)
    return "\n".join(line.replace("\u00a0", " ") for line in lines)


def config_regime() -> str:
    """The measured line of the COCO and OpenImages configs' comments: the regime rows they
    take, each on the machine class that holds most of its seeds, against that class's
    strongest batch-16 baseline (:func:`largedet_study.fairness.per_class`; generated,
    wrapped for a yaml comment)."""
    classes = [(cls, mine, base) for cls, mine, base in fairness.per_class(regime_families_all()) if base is not None]
    parts = []
    for name, what in (("pmd_lamb-bs256-lrwsd-wd0.01", "1.0x"), ("pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01", "1.4x"),
                       ("pmd_lamb-bs256-ep2x-lrwsd-wd0.01", "2x"),
                       ("pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01", "4x the batch (4.2% of N) at 1.4x")):  # fmt: skip
        held = [(len(mine[name].trained), -i, cls, mine[name], base)
                for i, (cls, mine, base) in enumerate(classes) if name in mine and mine[name].trained]  # fmt: skip
        if not held:
            continue
        _, _, cls, f, base = max(held)
        h = welch(f.values("holdout_ap"), base.values("holdout_ap"))
        r = welch(f.values("box_ap"), base.values("box_ap"))
        parts.append(f"{what} {h.interval().replace('[', '(').replace(']', ')')} held-out, "
                     f"{r.interval().replace('[', '(').replace(']', ')')} shapes_val (n={len(f.trained)} "
                     f"on {cls}, against [regime: {base.name}], n={len(base.trained)})")
    text = ("Measured at 1% of N per step, each row on one machine class minus that class's strongest "
            "batch-16 baseline, Welch's 95% interval in parentheses: "
            + "; ".join(parts) + ". Generated by study/study_report.py; docs/study.md, \"The answer\".")  # fmt: skip
    return _wrap(text)


def config_steps_bs1024() -> str:
    """The measured line of the study's batch-1024 config: its row and family on 2000 images
    of each split, against the steps grid's baseline."""
    fams = families("steps")
    rec, base = fams["pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01"], fams["sgd-bs16-wu2"]
    seed0 = _family("steps", "=pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01").rows[0]
    h = welch(rec.values("holdout_ap"), base.values("holdout_ap"))
    r = welch(rec.values("box_ap"), base.values("box_ap"))
    text = (f"Measured on 2000 images of each split: this run (seed 0) {seed0['box_ap']} shapes_val, "
            f"{seed0['holdout_ap']} held-out; its seeds {_ms(rec.summary('box_ap'))} / "
            f"{_ms(rec.summary('holdout_ap'))} (n={len(rec.trained)}); minus the batch-16 SGD "
            f"baseline sgd-bs16-wu2 (n={len(base.trained)}): {r.interval()} shapes_val, "
            f"{h.interval()} held-out. Generated by study/study_report.py.")  # fmt: skip
    return _wrap(text)


def config_video(csv_name: str = "video4k") -> str:
    """The Kinetics config's measured lines: every batch-256 row of the tsm4k grid without
    multigrid, one line each (seeds, held-out and reported top-1 minus the batch-16 SGD
    baseline, the reported one with its Welch 95% interval), best held-out first, the held-out
    choice at <= 1.4x the epochs with three seeds or more marked."""
    holdout, reported = SPLITS[csv_name]
    base = video_baseline(csv_name)
    if base is None:
        return "(no finished video cell yet)"
    choice = video_choice(csv_name, 256, 1.4)
    rows = [f for f in families(csv_name).values()
            if f.batch == 256 and "multigrid" not in f.name and f.trained and f.values(holdout)]  # fmt: skip
    rows.sort(key=lambda f: -f.summary(holdout).mean)
    base_ho = base.summary(holdout).mean
    lines = [_wrap(f"tsm4k grid (4,096 reported and 2,048 held-out videos), batch 256 minus batch 16 "
                   f"({base.name}, n={len(base.trained)}), top-1: [row, seeds] held-out; reported "
                   "[Welch 95% interval]:")]
    for f in rows:
        d = welch(f.values(reported), base.values(reported))
        mark = "  <- this config's recipe (the held-out choice)" if choice and f.name == choice.name else ""
        lines.append(f"[video4k: {f.name}, n={len(f.trained)}] {fmt(f.summary(holdout).mean - base_ho, sign=True)}; "
                     f"{d.interval()}{mark}")
    return "\n".join(lines) + "\nGenerated by study/study_report.py."


KINETICS_CONFIG = "[Kinetics-400 TSM](../projects/video/configs/kinetics400_tsm_r50_8f.yaml)"
#: the configs that carry a study family's recipe
RECIPE_CONFIGS = {
    ("regime", "pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01"): "[`r50_fpn_bs1056.yaml`](../configs/r50_fpn_bs1056.yaml), "
    "[Mask R-CNN](../configs/mask_rcnn_r50_fpn_bs1056.yaml)",
    ("regime", "pmd_lamb-bs256-lrwsd-wd0.01"): "[OpenImages](../configs/openimages_r50_fpn_bs640.yaml)",
    ("steps", "pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01"):
        "[`..._pmdlamb_bs1024.yaml`](../configs/shapes/study/faster_rcnn_R10w16_FPN_64px_pmdlamb_bs1024.yaml)",
}
_GRID_N = {"regime": 24576, "steps": 1536, "video": 4096, "video4k": 4096, "video4k_zen5": 4096}
_GRID_LABEL = {"regime": "Detection, regime grid", "steps": "Detection, steps grid",
               "video": "Video, first grid", "video4k": "Video, tsm4k grid",
               "video4k_zen5": "Video, tsm4k grid, EPYC-Zen5"}  # fmt: skip


def recipe_table() -> str:
    """One table per grid to choose from (the regime grid's: one per machine class, its rows of
    every CSV of that class against that class's own baseline): every recipe with two seeds or
    more on it at a batch above 16, as a share of its grid's data, against the strongest
    batch-16 baseline (the held-out split where the grid has one), with n and Welch's 95%
    interval; under each, the configs that carry a recipe."""
    out = []
    # (CSV, its families, their baseline, the machine class: the regime grid's, one per class)
    sections = [("regime", mine, base, cls) for cls, mine, base in fairness.per_class(regime_families_all())]
    for csv_name in ("steps", "video4k", "video4k_zen5", "video"):
        fams = families(csv_name)
        base = fams.get("sgd-bs16-wu2") if csv_name == "steps" else video_baseline(csv_name)
        sections.append((csv_name, fams, base, None))
    for csv_name, fams, base, cls in sections:
        holdout, reported = SPLITS[csv_name]
        column = holdout or reported
        rows = sorted((f for f in fams.values() if f.batch > 16 and len(f.trained) >= 2),
                      key=lambda f: (f.batch, _epochs_factor(f.name), f.name))  # fmt: skip
        if base is None or not rows:
            continue
        split = "held-out" if holdout else "reported"
        where = f", {cls}" if cls else ""
        out += [f"**{_GRID_LABEL[csv_name]}{where}** (N = {_GRID_N[csv_name]:,}; the baseline `{base.name}`, "
                f"n={len(base.trained)}; {split} split):", "",
                "| batch / N | recipe | epochs | n | diff [95% interval] | lower bound |",
                "| ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
        carried = []
        for f in rows:
            d = welch(f.values(column), base.values(column))
            words = describe(f.name).split(", ")
            what = ", ".join(w for w in [words[0]] + words[2:] if not w.endswith("x the epochs"))
            if " LR" not in what:
                # the video grids' default is cosine; multigrid runs the step schedule always
                cosine = csv_name.startswith("video") and "multigrid" not in f.name
                what += ", cosine LR" if cosine else ", step LR"
            what = what.replace("weight decay", "wd")
            share = f"{100 * f.batch / _GRID_N[csv_name]:.3g}%"
            bound = "-" if d.lower_bound is None else fmt(d.lower_bound, sign=True)
            out.append(f"| {f.batch} ({share}) | {what} | {_epochs_factor(f.name):g}x | "
                       f"{len(f.trained)}/{len(base.trained)} | {d.interval()} | {bound} |")  # fmt: skip
            if (csv_name, f.name) in RECIPE_CONFIGS:
                carried.append(f"`{f.name}`: {RECIPE_CONFIGS[(csv_name, f.name)]}")
            elif csv_name == "video4k" and f.name == getattr(video_choice(csv_name, 256, 1.4), "name", None):
                # the Kinetics config takes the held-out choice (its test checks the recipe)
                carried.append(f"`{f.name}`: {KINETICS_CONFIG}")
        out.append("")
        if carried:
            out += ["Carried by the configs: " + "; ".join(carried) + ".", ""]
    return "\n".join(out).rstrip("\n")


#: generated blocks by name
BLOCKS: Dict[str, Callable[[], str]] = {
    "results-summary": results_summary,
    "recipes": recipe_table,
    "config-regime": config_regime,
    "config-steps-bs1024": config_steps_bs1024,
    "config-video": config_video,
    "regime-cells": lambda: cells_table("regime", extra=("regime_epyc",)),
    "regime-comparison": regime_comparison,
    "regime-verdict": regime_verdict,
    "regime-optimizers": regime_optimizers,
    "steps-cells": lambda: cells_table("steps"),
    "steps2000-cells": lambda: _eval2000_table(),
    "steps-table": lambda: optimizer_batch_table("steps", "steps"),
    "short-table": lambda: optimizer_batch_table("short", "short"),
    "steps-comparison": lambda: comparison_table(
        "steps", families("steps")["sgd-bs16-wu2"],
        [(f"`{n}`", f) for n, f in families("steps").items() if f.batch > 16 and f.trained]),
    "video-cells": lambda: video_cells("video"),
    "video-comparison": lambda: video_comparison("video"),
    "video4k-cells": lambda: video_cells("video4k"),
    "video4k-verdict": lambda: video_verdict("video4k"),
    "video4k-comparison": lambda: video_comparison("video4k"),
    "video4k-multigrid": lambda: multigrid_table("video4k"),
    "video4k-before-bn-fix-cells": lambda: video_cells("video4k_before_bn_fix"),
    "video4k-zen5-cells": lambda: video_cells("video4k_zen5"),
    "video4k-zen5-verdict": lambda: video_verdict("video4k_zen5"),
    "video4k-zen5-comparison": lambda: video_comparison("video4k_zen5"),
}
BLOCKS.update(GPU_BLOCKS)
BLOCKS.update(DEMO_BLOCKS)
BLOCKS.update(VIDEO_BENCH_BLOCKS)
BLOCKS.update(MG_TIME_BLOCKS)
BLOCKS.update(MG_TIME_PROFILE_BLOCKS)


def optimizer_batch_table(csv_name: str, grid: str) -> str:
    """The optimizer x batch table of ``grid``'s main cells: the reported AP's mean over the
    seeds to one decimal, n in brackets where there are several; "div." where every seed
    diverged ("div. k/n" some of them); "-" a cell not in the grid."""
    from .grid import build_grid
    from .plotting import one_decimal

    fams = families(csv_name)
    main = build_grid(grid).main
    batches = sorted({c.batch for c in main})
    optimizers = list(dict.fromkeys(c.optimizer for c in main))
    names = {(c.optimizer, c.batch): c.name for c in main}
    lines = ["| optimizer | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "| --- | " + " | ".join("---:" for _ in batches) + " |"]  # fmt: skip
    for opt in optimizers:
        cells = []
        for b in batches:
            f = fams.get(names.get((opt, b), ""))
            if f is None:
                cells.append("-")
                continue
            values = f.values(SPLITS[csv_name][1])
            diverged = len(f.rows) - len(f.trained)
            text = "div." if not values else one_decimal(round(sum(values) / len(values), 2))
            if values and diverged:
                text += f", div. {diverged}/{len(f.rows)}"
            elif len(f.rows) > 1:
                text += f" (n={len(f.rows)})"
            cells.append(text)
        lines.append(f"| {describe(opt)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _eval2000_table() -> str:
    """The steps grid's cells re-evaluated on 2000 images of each split: n, means ± SD."""
    groups: Dict[str, List[dict]] = {}
    for row in _read("steps2000"):
        groups.setdefault(_SEED.sub("", row["cell"]), []).append(row)
    lines = ["| cell (seeds as -sN) | n | held-out AP | reported AP |", "| --- | ---: | ---: | ---: |"]
    for name, rows in groups.items():
        h = summarize([float(r["holdout_ap"]) for r in rows if r["holdout_ap"]])
        r_ = summarize([float(r["box_ap"]) for r in rows if r["box_ap"]])
        lines.append(f"| `{name}` | {h.n} | {_ms(h)} | {_ms(r_)} |")
    return "\n".join(lines)


# --- markers ------------------------------------------------------------------------------

_MD_BLOCK = re.compile(r"(<!-- BEGIN generated (\S+) -->\n)(.*?)(<!-- END generated \2 -->)", re.S)
_YAML_BLOCK = re.compile(r"(# BEGIN generated (\S+)\n)(.*?)(# END generated \2)", re.S)
_INLINE = re.compile(r"<!--v (\S+?)-->(.*?)<!--/v-->")


def fill(text: str, yaml: bool = False) -> str:
    """``text`` with every block and inline value regenerated."""

    def block(m):
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}; one of {sorted(BLOCKS)}")
        body = BLOCKS[name]()
        if yaml:
            body = "\n".join(("# " + line).rstrip() for line in body.splitlines())
        return m.group(1) + body + "\n" + m.group(4)

    text = (_YAML_BLOCK if yaml else _MD_BLOCK).sub(block, text)
    if not yaml:
        text = _INLINE.sub(lambda m: f"<!--v {m.group(1)}-->{value(m.group(1))}<!--/v-->", text)
    return text


def _marked_files() -> List[str]:
    out = []
    for entry in FILES:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            out.append(path)
            continue
        for folder, _, names in os.walk(path):
            out += [os.path.join(folder, n) for n in sorted(names) if n.endswith((".md", ".yaml"))]
    return [p for p in out if "generated " in open(p).read() or "<!--v " in open(p).read()]


def check() -> List[str]:
    """The marked files (relative paths) whose generated parts differ from the CSVs."""
    stale = []
    for path in _marked_files():
        text = open(path).read()
        if fill(text, yaml=path.endswith(".yaml")) != text:
            stale.append(os.path.relpath(path, ROOT))
    return stale


def write() -> List[str]:
    """Regenerate every marked file; the ones that changed."""
    changed = []
    for path in _marked_files():
        text = open(path).read()
        new = fill(text, yaml=path.endswith(".yaml"))
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            changed.append(os.path.relpath(path, ROOT))
    return changed
