"""The video batch study's figure and table: top-1 against the global batch for each
optimizer at equal epochs, beside the batch-16 baseline's seed band (the CSV of
``study/video_batch_study.py``)."""

from __future__ import annotations

import csv
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["load_video_study", "curves", "video_table", "plot_top1_vs_batch"]

_SEED = re.compile(r"-s\d+$")
_LABELS = {"sgd": "SGD, linear rule", "pmd_lamb": "PMD-LAMB, square-root rule"}


def load_video_study(path: str) -> List[dict]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"video study CSV not found: {path}")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["batch"] = int(r["batch"])
        r["top1"] = float(r["top1"]) if r["top1"] not in ("", None) else None
    return rows


def _group(rows: Sequence[dict]) -> Dict[str, List[dict]]:
    groups: Dict[str, List[dict]] = {}
    for r in rows:
        groups.setdefault(_SEED.sub("", r["cell"]), []).append(r)
    return groups


def curves(rows: Sequence[dict]) -> Tuple[Dict[str, List[tuple]], List[float], Dict[str, List[float]]]:
    """``(lines, baseline, others)``: per optimizer the TSM cells with nothing but the batch
    changed as ``(batch, mean top-1 or None if every seed diverged, seeds, top-1s)`` sorted by
    batch; the batch-16 SGD baseline's top-1 per seed; every other cell (multigrid, TSN)
    by name with its top-1s."""
    lines: Dict[str, List[tuple]] = {}
    others: Dict[str, List[float]] = {}
    for base, reps in _group(rows).items():
        values = [r["top1"] for r in reps if r["diverged"] != "yes" and r["top1"] is not None]
        m = re.fullmatch(r"(sgd|pmd_lamb)-bs(\d+)", base)
        if m:
            mean = sum(values) / len(values) if values else None
            lines.setdefault(m.group(1), []).append((int(m.group(2)), mean, len(reps), values))
        else:
            others[base] = values
    for v in lines.values():
        v.sort()
    baseline = next((vals for b, _, _, vals in lines.get("sgd", []) if b == 16), [])
    return lines, baseline, others


def video_table(rows: Sequence[dict]) -> str:
    """Markdown: optimizer x batch, mean top-1 over seeds (their count), "div." where a
    seed diverged; then the other cells."""
    lines, baseline, others = curves(rows)
    batches = sorted({b for v in lines.values() for b, *_ in v})
    out = ["| optimizer | " + " | ".join(f"batch {b}" for b in batches) + " |",
           "| --- | " + " | ".join("---:" for _ in batches) + " |"]  # fmt: skip
    for opt, points in lines.items():
        by_batch = {b: (mean, n, vals) for b, mean, n, vals in points}
        cells = []
        for b in batches:
            if b not in by_batch:
                cells.append("-")
                continue
            mean, n, vals = by_batch[b]
            text = "div." if mean is None else f"{mean:.1f}"
            if mean is not None and len(vals) < n:
                text += f", div. {n - len(vals)}/{n}"
            elif n > 1:
                text += f" ({n} seeds: " + ", ".join(f"{v:.1f}" for v in vals) + ")"
            cells.append(text)
        out.append(f"| {_LABELS.get(opt, opt)} | " + " | ".join(cells) + " |")
    for name, vals in others.items():
        out.append(f"| {name} | " + (", ".join(f"{v:.1f}" for v in vals) or "div.") + " |")
    return "\n".join(out)


def plot_top1_vs_batch(rows: Sequence[dict], path: str, num_train: int, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, baseline, others = curves(rows)
    fig, ax = plt.subplots(figsize=(7, 4.4))
    if baseline:
        mean = sum(baseline) / len(baseline)
        ax.axhspan(min(baseline), max(baseline), color="0.8", alpha=0.6,
                   label=f"SGD batch 16 ({len(baseline)} seed{'s' if len(baseline) != 1 else ''})")  # fmt: skip
        ax.axhline(mean - 1.0, color="0.4", lw=1, ls="--", label="baseline - 1 top-1")
    for opt, points in lines.items():
        ok = [(b, m) for b, m, *_ in points if m is not None]
        ax.plot([b for b, _ in ok], [m for _, m in ok], "-o", label=_LABELS.get(opt, opt))
        for b, m, n, vals in points:
            if m is None:
                ax.plot([b], [ax.get_ylim()[0] if ok else 0], "x", color="red", ms=10)
                ax.annotate("diverged", (b, ax.get_ylim()[0]), fontsize=7, color="red",
                            textcoords="offset points", xytext=(4, 4))  # fmt: skip
            elif n > 1:
                ax.annotate(f"{n} seeds", (b, m), fontsize=7, textcoords="offset points", xytext=(4, -10))
    for name, vals in others.items():
        if vals and "multigrid" in name:
            b = int(re.search(r"bs(\d+)", name).group(1))
            ax.plot([b], [sum(vals) / len(vals)], "D", label=name)
    tsn = [v for name, vals in others.items() if name.startswith("tsn") for v in vals]
    if tsn:
        ax.axhline(sum(tsn) / len(tsn), color="tab:red", lw=1, ls=":", label="TSN batch 16 (no shift)")
    ax.set_xscale("log", base=2)
    batches = sorted({b for v in lines.values() for b, *_ in v})
    ax.set_xticks(batches)
    ax.set_xticklabels([f"{b}\n{100 * b / num_train:.2g}%" for b in batches])
    ax.set_xlabel("global batch (clips per step) and its share of the training set")
    ax.set_ylabel("top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title or "TSM top-1 against the global batch, equal epochs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def baseline_mean(rows: Sequence[dict]) -> Optional[float]:
    _, baseline, _ = curves(rows)
    return sum(baseline) / len(baseline) if baseline else None
