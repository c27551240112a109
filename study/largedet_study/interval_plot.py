"""The comparison tables as a picture: each row's difference from the batch-16 baseline with
its Welch 95% interval, held-out and reported split side by side
(:func:`plot_intervals`); ``python study/study_report.py --figures`` draws the regime
grid's and the tsm4k video grid's (:data:`FIGURES`).

The numbers are those of :func:`largedet_study.report.comparisons`, the ones the generated
tables print; a row of one seed against a baseline of one has no interval and is drawn as a
point alone.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import report
from .plotting import _pyplot
from .stats import Difference

__all__ = ["FIGURES", "draw", "plot_intervals"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plain(label: str) -> str:
    """A table's label without its Markdown code marks."""
    return label.replace("`", "")


def plot_intervals(baseline: str, rows: Sequence[Tuple[str, object, Dict[str, Optional[Difference]]]],
                   path: str, unit: str, margin: float, title: str) -> List[Tuple[str, Dict[str, Optional[float]]]]:  # fmt: skip
    """Draws ``rows`` (``(label, family, {split: Difference})``, as
    :func:`largedet_study.report.comparisons` gives them) to ``path``: one line per row, the
    difference as a dot and its 95% interval as a bar, one panel per split; lines at 0 and at
    ``-margin`` (the goal's margin, in ``unit``); ``baseline`` names the baseline under the
    title. Rows are ordered by the first split's
    difference, best on top. Returns the drawn ``(label, {split: difference})`` top to bottom."""
    plt = _pyplot()
    splits = list(rows[0][2]) if rows else ["reported"]
    first = splits[0]
    ordered = sorted(rows, key=lambda r: -(r[2][first].diff if r[2][first] is not None else float("-inf")))
    height = 1.9 + 0.32 * max(4, len(ordered))
    fig, axes = plt.subplots(1, len(splits), figsize=(5.2 * len(splits) + 2.6, height), sharey=True, squeeze=False)
    ys = list(range(len(ordered)))[::-1]
    drawn = []
    for label, fam, diffs in ordered:
        drawn.append((_plain(label), {s: (None if diffs[s] is None else diffs[s].diff) for s in splits}))
    for ax, split in zip(axes[0], splits):
        ax.axvline(0.0, color="0.3", lw=1)
        ax.axvline(-margin, color="0.3", lw=1, ls="--", label=f"baseline - {margin:g} {unit}")
        for y, (label, fam, diffs) in zip(ys, ordered):
            d = diffs[split]
            if d is None:
                continue
            color = "tab:blue" if len(fam.trained) >= 3 else "tab:orange"
            if d.low is not None:
                ax.plot([d.low, d.high], [y, y], color=color, lw=2, solid_capstyle="butt")
            ax.plot([d.diff], [y], "o", color=color, ms=5)
        ax.set_title(f"{split} split", fontsize=10)
        ax.set_xlabel(f"{unit} minus the baseline's mean (95% interval)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(ys)
    axes[0][0].set_yticklabels([f"{_plain(lab)} (n={len(f.trained)})" for lab, f, _ in ordered], fontsize=8)
    axes[0][0].plot([], [], "o-", color="tab:blue", label=">= 3 seeds")
    axes[0][0].plot([], [], "o-", color="tab:orange", label="< 3 seeds")
    # the legend under the panels, where it hides no row
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"{title}\nthe baseline: {baseline}", fontsize=10)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def _name(base) -> str:
    return f"{base.name} ({report.seed_count(len(base.trained))})"


def _regime(path: str):
    base, rows = report.regime_rows()
    return plot_intervals(_name(base), report.comparisons(base, rows, "regime"), path, "AP", 0.5,
                          "Regime grid (detection, N = 24,576): each row against the batch-16 baseline")  # fmt: skip


def _video4k(path: str):
    base, rows = report.video_rows("video4k")
    if base is None:
        return []
    return plot_intervals(_name(base), report.comparisons(base, rows, "video4k"), path, "top-1", 1.0,
                          "tsm4k video grid (N = 4,096): each row against the batch-16 baseline")  # fmt: skip


#: figure path (in the checkout) -> the function that draws it
FIGURES: Dict[str, Callable[[str], list]] = {
    "study/results/figures/regime_intervals.png": _regime,
    "study/results/video/figures/tsm4k_intervals.png": _video4k,
}


def draw(root: str = ROOT) -> List[str]:
    """Draws every figure of :data:`FIGURES` under ``root``; returns their paths."""
    out = []
    for rel, fn in FIGURES.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fn(path)
        out.append(path)
    return out
