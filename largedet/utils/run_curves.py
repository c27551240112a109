"""Training runs' curves against epochs, for ``tools/plot_metrics.py --runs``.

A run is an ``OUTPUT_DIR`` written by ``tools/train_net.py``: ``metrics.json`` (Detectron2's
JSON writer, one line per logged step), ``run_summary.json`` (global batch, number of
training images) and ``config.yaml`` (the global batch of a run without a summary).
:func:`plot_curves` draws training loss and LR of several runs against *epochs* (iteration x
global batch / training images), an x-axis on which runs at different batches line up. Uses
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from largedet.launch.run_summary import read_run_summary

__all__ = ["RunCurves", "load_run", "plot_curves"]


def pyplot():
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class RunCurves:
    """The logged curves of one training run, against epochs."""

    label: str
    global_batch: int
    num_train: int
    iterations: List[int] = field(default_factory=list)
    loss: List[Optional[float]] = field(default_factory=list)
    lr: List[Optional[float]] = field(default_factory=list)
    scalars: Dict[str, List[tuple]] = field(default_factory=dict)

    def epochs(self, iterations: Sequence[int]) -> List[float]:
        return [(i + 1) * self.global_batch / self.num_train for i in iterations]


def load_run(run_dir: str, label: str = "", num_train: Optional[int] = None) -> RunCurves:
    """Read ``run_dir``'s metrics.json, its global batch (run_summary.json, else
    config.yaml) and training-set size (``num_train``, else run_summary.json)."""
    metrics_path = os.path.join(run_dir, "metrics.json")
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"no metrics.json in {run_dir}")
    summary = read_run_summary(run_dir) or {}
    batch = summary.get("batch", {}).get("global_batch") or _global_batch(run_dir)
    if num_train is None:
        num_train = summary.get("dataset_size")
        if not num_train:
            raise ValueError(
                f"{run_dir}: no run_summary.json with the number of training images; pass "
                "num_train (tools/plot_metrics.py --num-train)"
            )
    curves = RunCurves(label or os.path.basename(os.path.normpath(run_dir)), batch, num_train)
    seen = {}
    with open(metrics_path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if "iteration" not in record:
                continue
            seen[record["iteration"]] = record  # a resumed run rewrites its last steps
    for it in sorted(seen):
        record = seen[it]
        if "total_loss" in record:
            curves.iterations.append(it)
            curves.loss.append(record["total_loss"])
            curves.lr.append(record.get("lr"))
        for key, value in record.items():
            if key.startswith("agvm/") and isinstance(value, (int, float)):
                curves.scalars.setdefault(key, []).append((it, value))
    return curves


def _global_batch(run_dir: str) -> int:
    config_path = os.path.join(run_dir, "config.yaml")
    if os.path.exists(config_path):
        with open(config_path) as f:
            in_solver = False
            for line in f:
                if not line.startswith(" "):
                    in_solver = line.startswith("SOLVER:")
                elif in_solver and line.strip().startswith("IMS_PER_BATCH:"):
                    return int(line.split(":", 1)[1])
    raise ValueError(f"{run_dir}: no run_summary.json and no SOLVER.IMS_PER_BATCH in config.yaml")


def plot_curves(runs: Sequence[RunCurves], path: str, title: str = "") -> str:
    """Training loss (log scale) and LR (log scale) against epochs, one line per run."""
    plt = pyplot()
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(7.0, 6.4), sharex=True)
    for run in runs:
        x = run.epochs(run.iterations)
        loss = [(e, v) for e, v in zip(x, run.loss) if v is not None and math.isfinite(v)]
        if loss:
            ax_loss.plot(*zip(*loss), label=f"{run.label} (batch {run.global_batch})", lw=1.2,
                         marker="o" if len(loss) == 1 else None)  # one point: a dot, not nothing
        lr = [(e, v) for e, v in zip(x, run.lr) if v is not None and v > 0]
        if lr:
            ax_lr.plot(*zip(*lr), lw=1.2, marker="o" if len(lr) == 1 else None)
    ax_loss.set_yscale("log")
    ax_loss.set_ylabel("total training loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=7)
    ax_lr.set_yscale("log")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("epochs (iteration x global batch / training images)")
    ax_lr.grid(alpha=0.3)
    ax_loss.set_title(title or "Loss and LR against epochs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
