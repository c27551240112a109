"""Figures from training runs and from the batch-scaling study.

* :func:`plot_ap_vs_batch`: box AP against global batch, one line per optimizer, diverged
  runs marked on the axis (the study CSV of ``study/batch_scaling_study.py``);
* :func:`plot_throughput`: images/s of each run of the study;
* :func:`plot_ap_vs_epochs`: box AP against the epoch budget for PMD-LAMB at each batch,
  beside the batch-16 baseline's seed band (:func:`epoch_curve`, :func:`parity_bracket`);
* :func:`plot_curves` (from :mod:`largedet.utils.run_curves`): training loss and LR of
  several runs against *epochs* (iteration x global batch / training images).

A run is an ``OUTPUT_DIR`` written by ``tools/train_net.py``: ``metrics.json`` (Detectron2's
JSON writer, one line per logged step), ``run_summary.json`` (global batch, number of
training images) and ``config.yaml`` (the global batch of a run without a summary). Uses
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Dict, List, Optional, Sequence

from largedet.utils.run_curves import RunCurves, load_run, plot_curves, pyplot
from .grid import cell_kind

__all__ = [
    "RunCurves",
    "load_run",
    "load_study",
    "EpochPoint",
    "epoch_curve",
    "parity_bracket",
    "plot_ap_vs_batch",
    "plot_ap_vs_epochs",
    "plot_curves",
    "plot_regimes",
    "plot_throughput",
    "regime_gaps",
    "regime_table",
    "mean_ap",
    "seed_replicas",
    "study_table",
    "with_reevaluation",
]



_pyplot = pyplot


def load_study(path: str) -> List[dict]:
    """The rows of a study CSV, with numbers parsed (empty cells become None)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"study CSV not found: {path}")
    numeric = {"batch": int, "iterations": int, "lr": float, "images_per_s": float,
               "box_ap": float, "ap50": float, "ap75": float, "wall_clock_s": float,
               "pmd_period": int, "warmup_iters": int, "holdout_ap": float}  # fmt: skip
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"cell", "optimizer", "batch", "box_ap", "diverged"} - set(
            reader.fieldnames or ()
        )
        if missing:
            raise ValueError(f"{path}: not a study CSV, missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            for key, kind in numeric.items():
                value = row.get(key, "")
                try:
                    row[key] = kind(value) if value not in ("", None) else None
                except ValueError as e:
                    raise ValueError(f"{path}, line {line}: column {key!r}: {value!r}") from e
            rows.append(row)
    return rows


def one_decimal(value) -> str:
    """``value`` (an AP the CSV keeps to two decimals, or a ``Decimal``) to one decimal, halves rounded up
    as written in decimal: 75.35 -> "75.4" (``f"{75.35:.1f}"`` gives "75.3", the nearest
    binary double being 75.3499...)."""
    exact = value if isinstance(value, Decimal) else Decimal(repr(value))
    return str(exact.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


_SEED_SUFFIX = re.compile(r"-s\d+$")


def seed_replicas(rows: Sequence[dict], cell: str) -> List[dict]:
    """The rows of ``cell`` and of its other seeds (the same name up to a ``-s<N>`` suffix;
    a cell run with the config's seed has none), in CSV order."""
    base = _SEED_SUFFIX.sub("", cell)
    return [r for r in rows if _SEED_SUFFIX.sub("", r["cell"]) == base]


def mean_ap(replicas: Sequence[dict], key: str = "box_ap") -> Optional[float]:
    """The mean of ``key`` over the replicas that did not diverge; None when none has it."""
    values = [r[key] for r in replicas if r["diverged"] != "yes" and r.get(key) is not None]
    return sum(values) / len(values) if values else None


def study_table(rows: Sequence[dict]) -> str:
    """A Markdown table of box AP (optimizer x batch) of the main grid: the mean over the
    cell's seeds, their number in brackets when there are several; "div." marks a cell
    whose every seed diverged ("div. 1/2" some of them), "-" a cell not run."""
    main = [r for r in rows if cell_kind(r["cell"]) == "main"]
    batches = sorted({r["batch"] for r in main})
    optimizers = list(dict.fromkeys(r["optimizer"] for r in main))
    cell = {(r["optimizer"], r["batch"]): r for r in main}
    lines = ["| optimizer | " + " | ".join(f"batch {b}" for b in batches) + " |"]
    lines.append("| --- | " + " | ".join("---:" for _ in batches) + " |")
    for opt in optimizers:
        values = []
        for b in batches:
            r = cell.get((opt, b))
            if r is None:
                values.append("-")
                continue
            replicas = seed_replicas(rows, r["cell"])
            diverged = sum(x["diverged"] == "yes" for x in replicas)
            aps = [Decimal(repr(x["box_ap"])) for x in replicas
                   if x["diverged"] != "yes" and x["box_ap"] is not None]  # fmt: skip
            mean = sum(aps) / len(aps) if aps else None  # in decimal: 73.725 stays 73.725
            text = "div." if mean is None else one_decimal(mean)
            if diverged and mean is not None:
                text += f", div. {diverged}/{len(replicas)}"
            elif len(replicas) > 1:
                text += f" ({len(replicas)} seeds)"
            values.append(text)
        lines.append(f"| {opt} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def plot_ap_vs_batch(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Box AP against global batch (log scale), a line per optimizer over the main grid
    through the mean of each cell's seeds (each seed a dot where there are several); AGVM
    cells as dashed lines of the same colour; cells whose every seed diverged as crosses
    at AP 0."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows))
    colors = dict(zip(optimizers, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for opt in optimizers:
        for agvm, style in (("no", "-o"), ("yes", "--s")):
            kind = "agvm" if agvm == "yes" else "main"
            cells = sorted(
                (r for r in rows if r["optimizer"] == opt and cell_kind(r["cell"]) == kind),
                key=lambda r: r["batch"],
            )
            replicas = {r["cell"]: seed_replicas(rows, r["cell"]) for r in cells}
            ok = [r for r in cells if mean_ap(replicas[r["cell"]]) is not None]
            bad = [r for r in cells if mean_ap(replicas[r["cell"]]) is None and r["diverged"] == "yes"]
            label = opt + (" + AGVM" if agvm == "yes" else "")
            if ok:
                ax.plot([r["batch"] for r in ok], [mean_ap(replicas[r["cell"]]) for r in ok], style,
                        color=colors[opt], label=label, alpha=0.9 if agvm == "no" else 0.6)  # fmt: skip
                seeds = [(r["batch"], x["box_ap"]) for r in ok for x in replicas[r["cell"]]
                         if len(replicas[r["cell"]]) > 1 and x["box_ap"] is not None]  # fmt: skip
                if seeds:  # each seed as a small dot around the line through their mean
                    ax.plot(*zip(*seeds), ".", color=colors[opt], alpha=0.5, markersize=5)
            if bad:
                ax.plot([r["batch"] for r in bad], [0.0] * len(bad), "x", color=colors[opt],
                        markersize=10, mew=2, label=f"{label}: diverged" if not ok else None)  # fmt: skip
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in rows})
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("global batch (images per optimizer step)")
    ax.set_ylabel("box AP")
    ax.set_ylim(bottom=-2)
    ax.grid(alpha=0.3)
    ax.set_title(title or "Box AP vs global batch, same epochs (x: diverged)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_throughput(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Training images/s of every run in the study, grouped by batch."""
    plt = _pyplot()
    measured = [r for r in rows if r.get("images_per_s")]
    measured.sort(key=lambda r: (r["batch"], r["cell"]))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.28 * len(measured)), 4.2))
    ax.bar(range(len(measured)), [r["images_per_s"] for r in measured],
           color=["tab:red" if r["diverged"] == "yes" else "tab:blue" for r in measured])  # fmt: skip
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="tab:blue", label="trained"),
                       plt.Rectangle((0, 0), 1, 1, color="tab:red", label="diverged")],
              fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(measured)))
    ax.set_xticklabels([r["cell"] for r in measured], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("training images/s")
    ax.set_title(title or "Training throughput per run (red: diverged)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


_CURVE_CELL = re.compile(r"^pmd_lamb-bs(\d+)(?:-ep([\d.]+)x)?(.*)$")
_SEED_SUFFIX = re.compile(r"-s\d+$")
# the recipes an epoch curve is drawn for: the cell-name suffix (after the epoch factor,
# before the seed) and its label; "" is the study's recipe
EPOCH_RECIPES = {"": "", "-lrwsd-wd0.01": "WSD LR, weight decay 0.01"}
# the batch-16 SGD baseline of a grid: the steps grid's sgd-bs16-wu2, the regime grid's
# sgd-bs16-wu0.65 (each with Detectron2's warm-up in its own epochs)
_BASELINE_FAMILY = re.compile(r"^sgd-bs16-wu[\d.]+(?:-[a-z][\w.]*)*?(?:-s\d+)?$")


@dataclass(frozen=True)
class EpochPoint:
    """The mean AP (held-out and reported) of one batch at one epoch factor, and its seeds."""

    batch: int
    factor: float  # epochs / the baseline's epochs
    holdout: Optional[float]
    reported: Optional[float]
    seeds: int
    recipe: str = ""  # the cell-name suffix of the recipe (EPOCH_RECIPES); "": the study's


def _strongest_baseline(rows: Sequence[dict]) -> List[tuple]:
    """The (held-out, reported) AP of each seed of the grid's strongest batch-16 SGD recipe:
    of the families ``sgd-bs16-wu<w>[-<recipe>]``, the best held-out mean, as the study's
    report chooses it."""
    families: Dict[str, List[tuple]] = {}
    for r in rows:
        if _BASELINE_FAMILY.match(r["cell"]) and r["box_ap"] is not None and r["diverged"] != "yes":
            families.setdefault(_SEED_SUFFIX.sub("", r["cell"]), []).append((r["holdout_ap"], r["box_ap"]))
    if not families:
        return []

    def held_out_mean(seeds):
        values = [h for h, _ in seeds if h is not None]
        return sum(values) / len(values) if values else float("-inf")

    return families[max(families, key=lambda k: held_out_mean(families[k]))]


def epoch_curve(rows: Sequence[dict], recipes: Sequence[str] = tuple(EPOCH_RECIPES)) -> tuple:
    """The epochs-to-parity curves of a steps-grid study: ``(points, baseline)``. ``points``
    are the PMD-LAMB cells that change nothing but the batch and the epochs of one of
    ``recipes`` (``pmd_lamb-bs<B>[-ep<f>x]<recipe>[-s<n>]``), their seeds averaged, sorted
    by batch, recipe and factor; ``baseline`` is the seeds of the grid's strongest batch-16
    SGD recipe (:func:`_strongest_baseline`) as a list of (held-out, reported) AP."""
    baseline = _strongest_baseline(rows)
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        m = _CURVE_CELL.match(_SEED_SUFFIX.sub("", r["cell"]))
        if m and m.group(3) in recipes and r["diverged"] != "yes" and r["box_ap"] is not None:
            key = (int(m.group(1)), m.group(3), float(m.group(2) or 1.0))
            groups.setdefault(key, []).append(r)
    points = [
        EpochPoint(batch, factor, mean_ap(reps, "holdout_ap"), mean_ap(reps), len(reps), recipe)
        for (batch, recipe, factor), reps in sorted(groups.items())
    ]
    return points, baseline


def parity_bracket(points: Sequence[EpochPoint], baseline_ap: float, batch: int, tolerance: float = 1.0,
                   key: str = "reported", recipe: str = "") -> tuple:  # fmt: skip
    """``(below, within)``: the largest measured epoch factor of ``batch`` with ``recipe``
    whose mean AP (``key``) is more than ``tolerance`` below ``baseline_ap``, and the
    smallest above it that is within ``tolerance`` (None where there is none)."""
    mine = sorted((p for p in points if p.batch == batch and p.recipe == recipe), key=lambda p: p.factor)
    within = next((p.factor for p in mine if getattr(p, key) >= baseline_ap - tolerance), None)
    short = [p.factor for p in mine if getattr(p, key) < baseline_ap - tolerance
             and (within is None or p.factor < within)]  # fmt: skip
    return (max(short) if short else None), within


def plot_ap_vs_epochs(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Box AP against the epoch factor (epochs / the baseline's) for each batch and recipe
    of :func:`epoch_curve` (the study's recipe solid, another dashed), held-out and
    reported split side by side: a line through the mean of each factor's seeds, the
    number of seeds written beside a mean of several; the batch-16 baseline's seeds as a
    band (their range) around their mean, and the mean less 1 AP dashed."""
    plt = _pyplot()
    points, baseline = epoch_curve(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, key, index, name in ((axes[0], "holdout", 0, "held-out split (chooses)"),
                                 (axes[1], "reported", 1, "shapes_val (reports)")):  # fmt: skip
        values = [b[index] for b in baseline if b[index] is not None]
        if values:
            mean = sum(values) / len(values)
            ax.axhspan(min(values), max(values), color="0.8", alpha=0.6,
                       label=f"SGD batch 16, 1.0x ({len(values)} seed{'s' if len(values) != 1 else ''})")  # fmt: skip
            ax.axhline(mean, color="0.4", lw=1)
            ax.axhline(mean - 1.0, color="0.4", lw=1, ls="--", label="baseline - 1 AP")
        for batch, recipe in sorted({(p.batch, p.recipe) for p in points}):
            mine = [p for p in points if (p.batch, p.recipe) == (batch, recipe)
                    and getattr(p, key) is not None]  # fmt: skip
            label = f"PMD-LAMB batch {batch}" + (f", {EPOCH_RECIPES.get(recipe, recipe)}" if recipe else "")
            ax.plot([p.factor for p in mine], [getattr(p, key) for p in mine],
                    "--s" if recipe else "-o", label=label)  # fmt: skip
            for p in mine:
                if p.seeds > 1:
                    ax.annotate(f"{p.seeds} seeds", (p.factor, getattr(p, key)), fontsize=7,
                                textcoords="offset points", xytext=(4, -10))  # fmt: skip
        ax.set_xlabel("epochs / the baseline's epochs")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("box AP")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(title or "Box AP against the epoch budget")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class RegimeGap:
    """One point of :func:`regime_gaps`: a grid's PMD-LAMB cell (its seeds averaged) as the
    gap to that grid's batch-16 baseline mean, held-out and reported (negative: below)."""

    regime: str
    batch: int
    fraction: float  # batch / training images
    recipe: str
    factor: float
    holdout_gap: Optional[float]
    reported_gap: Optional[float]
    seeds: int


def _num_train(rows: Sequence[dict]) -> int:
    """The grid's training images: iterations x batch / epochs of any of its rows."""
    for r in rows:
        if r.get("iterations") and r.get("epochs") not in (None, ""):
            epochs = float(r["epochs"])
            if r["cell"].startswith("sgd-bs16") or "-ep" not in r["cell"]:
                return round(r["iterations"] * r["batch"] / epochs)
    raise ValueError("cannot tell the training images: no row with iterations and epochs")


def regime_gaps(regimes: Sequence[tuple]) -> List[RegimeGap]:
    """The gap of every epoch-curve point (:func:`epoch_curve`) of each ``(label, rows)``
    grid to its own baseline's mean AP, on both splits."""
    out = []
    for label, rows in regimes:
        points, baseline = epoch_curve(rows)
        if not baseline:
            continue
        n = _num_train(rows)
        base_h = [b[0] for b in baseline if b[0] is not None]
        base_r = [b[1] for b in baseline if b[1] is not None]
        mean_h = sum(base_h) / len(base_h) if base_h else None
        mean_r = sum(base_r) / len(base_r) if base_r else None
        for p in points:
            out.append(RegimeGap(
                label, p.batch, p.batch / n, p.recipe, p.factor,
                None if p.holdout is None or mean_h is None else p.holdout - mean_h,
                None if p.reported is None or mean_r is None else p.reported - mean_r,
                p.seeds,
            ))  # fmt: skip
    return out


def regime_table(gaps: Sequence[RegimeGap]) -> str:
    """A Markdown table of :func:`regime_gaps`: one row per grid, batch, recipe and factor."""
    lines = ["| grid | batch (batch/N) | recipe | epochs | seeds | gap held-out | gap reported |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for g in gaps:
        cells = [f"{v:+.2f}" if v is not None else "-" for v in (g.holdout_gap, g.reported_gap)]
        lines.append(f"| {g.regime} | {g.batch} ({100 * g.fraction:.2g}%) | "
                     f"{EPOCH_RECIPES.get(g.recipe, g.recipe) or 'step LR, wd 1e-4'} | {g.factor:g}x | {g.seeds} | "
                     f"{cells[0]} | {cells[1]} |")  # fmt: skip
    return "\n".join(lines)


def plot_regimes(regimes: Sequence[tuple], path: str, title: str = "") -> str:
    """Gap to each grid's batch-16 baseline (AP) against the epoch factor, held-out and
    reported split side by side; one line per grid, batch and recipe (the step recipe solid,
    warm-up-stable-decay with weight decay 0.01 dashed), batch / training images on the
    legend; the 1-AP goal dashed."""
    plt = _pyplot()
    gaps = regime_gaps(regimes)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    markers = "os^vD"
    labels = list(dict.fromkeys(g.regime for g in gaps))
    for ax, key, name in ((axes[0], "holdout_gap", "held-out split (chooses)"),
                          (axes[1], "reported_gap", "shapes_val (reports)")):  # fmt: skip
        ax.axhline(0.0, color="0.4", lw=1)
        ax.axhline(-1.0, color="0.4", lw=1, ls="--", label="baseline - 1 AP")
        for regime, batch, recipe in sorted({(g.regime, g.batch, g.recipe) for g in gaps},
                                            key=lambda k: (labels.index(k[0]), k[1], k[2])):  # fmt: skip
            mine = sorted((g for g in gaps if (g.regime, g.batch, g.recipe) == (regime, batch, recipe)
                           and getattr(g, key) is not None), key=lambda g: g.factor)  # fmt: skip
            if not mine:
                continue
            text = f"{regime}: batch {batch} = {100 * mine[0].fraction:.2g}% of N"
            text += ", WSD + wd 0.01" if recipe else ", step LR"
            ax.plot([g.factor for g in mine], [getattr(g, key) for g in mine],
                    ("--" if recipe else "-") + markers[labels.index(regime) % len(markers)], label=text)  # fmt: skip
        ax.set_xlabel("epochs / the baseline's epochs")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("AP minus the batch-16 baseline's mean")
    # the legend under both panels, where it hides no point whatever the gaps
    handles, texts = axes[1].get_legend_handles_labels()
    legend_height = 0.22 * -(-len(texts) // 2)  # inches: two columns
    fig.set_size_inches(11, 4.4 + legend_height)
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(title or "The gap to batch 16 against the epoch budget, by regime")
    fig.tight_layout(rect=(0, legend_height / (4.4 + legend_height) + 0.02, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def with_reevaluation(rows: Sequence[dict], path: str) -> tuple:
    """The rows of ``rows`` that a larger evaluation (the CSV of ``batch_scaling_study.py
    --eval-images N``) has, with its held-out and reported AP (``holdout_ap``, ``box_ap``),
    and the diverged ones (nothing to evaluate); and N. The study CSV's own 150-image
    figures are not mixed in."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"evaluation CSV not found: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"cell", "images", "holdout_ap", "box_ap"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not an evaluation CSV, missing columns {sorted(missing)}")
        found = {r["cell"]: r for r in reader}
    counts = {int(r["images"]) for r in found.values()}
    if not counts:
        raise ValueError(f"{path}: no evaluations in it yet")
    if len(counts) > 1:
        raise ValueError(f"{path}: evaluations on different image counts {sorted(counts)}")
    merged = []
    for row in rows:
        if row["cell"] in found:
            other = found[row["cell"]]
            merged.append(dict(row, holdout_ap=float(other["holdout_ap"]), box_ap=float(other["box_ap"])))
        elif row["diverged"] == "yes":
            merged.append(dict(row))
    return merged, counts.pop()


def plot_cells_at_batch(
    rows: Sequence[dict], batch: int, path: str, title: str = "",
    images: Optional[int] = None,
) -> List[tuple]:
    """Every cell at global batch ``batch`` as a pair of horizontal bars, box AP on the
    held-out split (the one that chooses) and on the reported one, best held-out AP on
    top, diverged cells last and marked; vertical lines at the baseline's two APs (the
    main-grid cell at the smallest batch of the first optimizer, e.g. SGD at 16; the mean
    of its seeds). Returns
    the plotted ``(cell, held-out AP, reported AP)`` in order, top to bottom (None:
    diverged or not evaluated). ``images``: the evaluations' image count, for the legend."""
    plt = _pyplot()
    cells = [r for r in rows if r["batch"] == batch]
    if not cells:
        raise ValueError(f"no cell at batch {batch}")

    def held_out(r):
        return r.get("holdout_ap") if r["diverged"] != "yes" else None

    def reported(r):
        return r["box_ap"] if r["diverged"] != "yes" else None

    cells.sort(key=lambda r: (held_out(r) is None, -(held_out(r) or 0.0), -(reported(r) or 0.0)))
    order = [(r["cell"], held_out(r), reported(r)) for r in cells]
    counted = f", {images} images" if images else ""
    fig, ax = plt.subplots(figsize=(7.0, 0.5 * len(order) + 1.6))
    ys = list(range(len(order)))[::-1]
    ax.barh([y + 0.2 for y in ys], [h or 0.0 for _, h, _ in order], height=0.4,
            color="tab:orange", label=f"held-out split{counted} (chooses)")  # fmt: skip
    ax.barh([y - 0.2 for y in ys], [v or 0.0 for _, _, v in order], height=0.4,
            color="tab:blue", label=f"reported split{counted}")  # fmt: skip
    main = [r for r in rows if cell_kind(r["cell"]) == "main" and r["diverged"] != "yes"]
    if main:
        first = main[0]["optimizer"]
        base = min((r for r in main if r["optimizer"] == first), key=lambda r: r["batch"])
        replicas = seed_replicas(rows, base["cell"])
        seeds = f", mean of {len(replicas)} seeds" if len(replicas) > 1 else ""
        if mean_ap(replicas, "holdout_ap") is not None:
            ax.axvline(mean_ap(replicas, "holdout_ap"), color="tab:orange", ls="--", lw=1,
                       label=f"{base['cell']} held-out{seeds}")  # fmt: skip
        if mean_ap(replicas) is not None:
            ax.axvline(mean_ap(replicas), color="tab:blue", ls="--", lw=1,
                       label=f"{base['cell']} reported{seeds}")  # fmt: skip
    ax.set_yticks(ys)
    ax.set_yticklabels([c for c, _, _ in order], fontsize=8)
    ax.set_xlabel("box AP")
    values = [x for _, h, v in order for x in (h, v) if x is not None]
    # the axis spans the cells within 20 AP of the best, so that differences of one AP show;
    # a cell far below it (one that stopped learning) is written out at the left edge
    near = [x for x in values if x >= max(values) - 20.0] if values else []
    left = max(0.0, min(near) - 3.0) if near else 0.0
    ax.set_xlim(left, (max(values) + 3.0) if values else 100.0)
    for y, (_, h, v) in zip(ys, order):
        if v is None:
            ax.text(left + 0.3, y, "diverged", va="center", fontsize=8, color="tab:red")
            continue
        for offset, x in ((0.2, h), (-0.2, v)):
            if x is None:
                continue
            inside = x > left + 2.0
            ax.text(x - 0.2 if inside else left + 0.3, y + offset, f"{x:.1f}", va="center",
                    ha="right" if inside else "left", fontsize=6,
                    color="white" if inside else "black")  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"Every cell at batch {batch}")
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return order


