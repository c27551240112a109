"""Video benchmark figures in projects/video/README.md, generated from their CSVs and
registered in :data:`largedet_study.report.BLOCKS`: the decoded-video cache
(``video-decoded-cache``, rows of ``projects/video/benchmarks/decoded_cache.py --csv``) and
multigrid against the base shape on the demo (``video-multigrid-demo``, rows of
``projects/video/benchmarks/multigrid.py --csv``)."""

from __future__ import annotations

import os
import re
from typing import Callable, Dict, List

from .demo_report import ROOT, _column, _dates, _groups, _span

DECODED_CACHE_CSV = "projects/video/benchmarks/results/decoded_cache.csv"
MULTIGRID_DEMO_CSV = "projects/video/benchmarks/results/multigrid_demo.csv"
#: multigrid's target on the demo: this speed-up of the training wall clock ...
MULTIGRID_SPEEDUP = 2.5
#: ... with top-1 at most this many points below the base shape's
MULTIGRID_TOP1_DROP = 1.0

__all__ = ["BLOCKS", "decoded_cache_table", "multigrid_demo_table"]


def decoded_cache_table(path: str = DECODED_CACHE_CSV) -> str:
    """One line per machine class, torch and load: the fresh processes measured, and the ranges
    over them of ms per training clip without the cache, with it in its first pass and later,
    and the ratio uncached / cached-later."""
    groups = _groups(path, ("cpu", "cpu_family_model", "torch", "load", "videos"))
    lines = [
        "| CPU (family/model) | torch | beside | videos | processes | uncached ms/clip "
        "| cached, first pass | cached, later passes | uncached / cached | dates |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (cpu, fm, torch_version, load, videos), runs in groups.items():
        lines.append(
            f"| {cpu} ({fm}) | {torch_version} | {load or 'nothing'} | {videos} | {len(runs)} "
            f"| {_column(runs, 'uncached_ms', '.2f')} | {_column(runs, 'cached_first_ms', '.2f')} "
            f"| {_column(runs, 'cached_ms', '.3f')} | {_column(runs, 'ratio', '.1f')}x | {_dates(runs)} |"
        )
    return "\n".join(lines)


def multigrid_demo_table(path: str = MULTIGRID_DEMO_CSV) -> str:
    """One line per schedule (the base shape; multigrid at each epoch factor) per machine
    class, torch, load, config and data: runs, epochs, steps, training seconds and top-1
    (ranges over the runs); for multigrid its speed-up (the base's training seconds over its
    own) and top-1 minus the base's, each within one invocation, and whether every run met
    the target (>= 2.5x at most 1 point lower)."""
    if not os.path.exists(os.path.join(ROOT, path)):
        return "(not measured yet)"
    groups = _groups(path, ("cpu", "cpu_family_model", "torch", "load", "config", "data"))
    lines = [
        "| CPU (family/model) | torch | beside | schedule | runs | epochs | optimizer steps | training s "
        "| top-1 % | speed-up (per run) | top-1 minus base | >= 2.5x, within 1 point | dates |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | --- |",
    ]
    for (cpu, fm, torch_version, load, _config, _data), runs in groups.items():
        base = {r["invocation"]: r for r in runs if r["schedule"] == "base"}
        schedules: Dict[str, List[dict]] = {}
        for r in runs:
            schedules.setdefault(r["epoch_factor"], []).append(r)
        for factor, rs in schedules.items():
            label = "base shape" if not factor else f"multigrid, {factor}x epochs"
            speed = drop = target = "-"
            paired = [(base[r["invocation"]], r) for r in rs if factor and r["invocation"] in base]
            if paired:
                ups = [float(b["train_s"]) / float(r["train_s"]) for b, r in paired]
                diffs = [float(r["top1"]) - float(b["top1"]) for b, r in paired]
                speed = ", ".join(f"{u:.2f}x" for u in ups)
                drop = ", ".join(f"{d:+.1f}" for d in diffs)
                met = all(u >= MULTIGRID_SPEEDUP and d >= -MULTIGRID_TOP1_DROP for u, d in zip(ups, diffs))
                target = "yes" if met else "no"
            lines.append(
                f"| {cpu} ({fm}) | {torch_version} | {load or 'nothing'} | {label} | {len(rs)} "
                f"| {_span([float(r['epochs']) for r in rs], 'g')} | {_column(rs, 'steps', '.0f')} "
                f"| {_column(rs, 'train_s', '.0f')} | {_column(rs, 'top1', '.1f')} | {speed} | {drop} "
                f"| {target} | {_dates(rs)} |"
            )
    return "\n".join(lines)


#: the GPU check's multigrid step (2026-11-26): the end of the benchmark's output
GPU_MULTIGRID_LOG = "benchmarks/results/gpu_check_h100_2026-11-26/lease2/multigrid_tail.log"
_SPEED_LINE = re.compile(r"^multigrid, ([\d.]+)x epochs: ([\d.]+)x faster training")


def gpu_multigrid_line(path: str = GPU_MULTIGRID_LOG) -> str:
    """The GPU check's multigrid step in one sentence, read from the benchmark's printed
    table (schedule | epochs | steps | training s | s/step | top-1 % | ...) and its speed-up
    lines."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().splitlines()
    table = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 6 and cells[2].isdigit():
            table[cells[0]] = cells
    speed = {m.group(1): m.group(2) for m in map(_SPEED_LINE.match, lines) if m}
    base = table["base shape"]
    parts = [f"the base shape trains {base[2]} steps in {base[3]} s to {base[5]}%"]
    for factor, up in speed.items():
        row = table[f"multigrid, {factor}x epochs"]
        parts.append(f"multigrid at {factor}x the epochs {up}x faster to {row[5]}%")
    return "; ".join(parts) + f" (`{path}`)"


BLOCKS: Dict[str, Callable[[], str]] = {
    "video-multigrid-gpu": gpu_multigrid_line,
    "video-decoded-cache": decoded_cache_table,
    "video-multigrid-demo": multigrid_demo_table,
}
