"""The video steps' output: ``projects/video/benchmarks/throughput.py`` (``video-throughput``)
and ``projects/video/benchmarks/multigrid.py`` (``multigrid``)."""

from __future__ import annotations

import re

from .step import Figures, numbers_found

_CLIPS_ROW = re.compile(
    r"^  (?P<model>TSN|TSM|TSM \(naive shift\)|I3D 3x3x3|I3D 3x1x1)\s+(?P<rate>[\d.]+) clips/s"
)


def parse_video_throughput(output: str, out: str) -> Figures:
    """projects/video/benchmarks/throughput.py: training clips/s per model, TSM's ratio to
    each I3D and the shift's cost against TSN (wall-clock)."""
    figures: Figures = {}
    rates = {m["model"]: float(m["rate"]) for m in map(_CLIPS_ROW.match, output.splitlines()) if m}
    if rates:
        figures["clips_per_s"] = rates
    figures.update(numbers_found(output, (
        ("tsm_vs_i3d_3x3x3", r"TSM / I3D 3x3x3:\s+([\d.]+)x"),
        ("tsm_vs_i3d_3x1x1", r"TSM / I3D 3x1x1:\s+([\d.]+)x"),
        ("shift_cost_pct", r"shift cost vs TSN: ([+-]?[\d.]+)% wall"),
        ("naive_shift_cost_pct", r"naive shift ([+-]?[\d.]+)% wall"),
    )))
    return figures


def summarize_video_throughput(f: Figures) -> str:
    rates = ", ".join(f"{name} {value:.3g}" for name, value in f["clips_per_s"].items())
    return (
        f"{rates} clips/s; TSM / I3D 3x3x3 {f['tsm_vs_i3d_3x3x3']:.2f}x (paper 1.6x), "
        f"/ I3D 3x1x1 {f['tsm_vs_i3d_3x1x1']:.2f}x (paper 2.9x); shift's cost vs TSN "
        f"{f['shift_cost_pct']:+.1f}% (goal <= 3%)"
    )


_MULTIGRID_ROW = re.compile(
    r"^\|\s*(?P<schedule>[^|]+?)\s*\|\s*(?P<epochs>[\d.]+)\s*\|\s*(?P<steps>\d+)\s*\|"
    r"\s*(?P<train_s>[\d.]+)\s*\|\s*(?P<s_per_step>[\d.]+)\s*\|\s*(?P<top1>[\d.]+)\s*\|"
)
_SPEEDUP = re.compile(
    r"^multigrid, (?P<factor>[\d.]+)x epochs: (?P<speedup>[\d.]+)x faster training "
    r"\((?P<fewer>[\d.]+)x fewer steps\), top-1 (?P<diff>[+-]?[\d.]+) points"
)


def parse_multigrid(output: str, out: str) -> Figures:
    """projects/video/benchmarks/multigrid.py: each schedule's epochs, steps, training
    seconds and top-1; each multigrid run's speed-up, step saving and top-1 difference."""
    figures: Figures = {}
    lines = output.splitlines()
    runs = {
        m["schedule"]: {
            "epochs": float(m["epochs"]),
            "steps": int(m["steps"]),
            "train_s": float(m["train_s"]),
            "s_per_step": float(m["s_per_step"]),
            "top1": float(m["top1"]),
        }
        for m in map(_MULTIGRID_ROW.match, lines)
        if m
    }
    if runs:
        figures["runs"] = runs
    speedups = [m for m in map(_SPEEDUP.match, lines) if m]
    if speedups:
        figures["speedup"] = {f"{m['factor']}x": float(m["speedup"]) for m in speedups}
        figures["fewer_steps"] = {f"{m['factor']}x": float(m["fewer"]) for m in speedups}
        figures["top1_diff"] = {f"{m['factor']}x": float(m["diff"]) for m in speedups}
    return figures


def summarize_multigrid(f: Figures) -> str:
    parts = [
        f"{factor} epochs: {f['speedup'][factor]:.2f}x faster ({f['fewer_steps'][factor]:.2f}x "
        f"fewer steps), top-1 {f['top1_diff'][factor]:+.1f}"
        for factor in f["speedup"]
    ]
    base = f["runs"].get("base shape")
    if base:
        parts.append(f"base top-1 {base['top1']:.1f}% in {base['train_s']:.0f} s")
    return "; ".join(parts) + " (paper: 4.5x, target >= 2.5x within 1 point)"
