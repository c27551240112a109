"""Video benchmark figures in projects/video/README.md, generated from their CSVs (rows
of ``projects/video/benchmarks/<script>.py --csv``) and the GPU check's saved output, and
registered in :data:`largedet_study.report.BLOCKS`:

- ``video-demo-runs``: the demo and its TSN control (``demo_runs.py``);
- ``video-throughput-training`` and ``video-throughput-decoding`` (``throughput.py``);
- ``video-decoded-cache`` (``decoded_cache.py``);
- ``video-precise-bn-cache``: multigrid's precise-BN pass, its own cache or training's (``precise_bn_cache.py``);
- ``video-multigrid-demo``: multigrid against the base shape on the demo (``multigrid.py``);
- ``video-throughput-gpu`` and ``video-multigrid-gpu``: the H100 check of 2026-11-26.
"""

from __future__ import annotations

import os
import re
import statistics
from typing import Callable, Dict, List

from .tables import ROOT, column_span, csv_groups, csv_missing, group_by, markdown_table, run_dates, span

DECODED_CACHE_CSV = "projects/video/benchmarks/results/decoded_cache.csv"
PRECISE_BN_CACHE_CSV = "projects/video/benchmarks/results/precise_bn_cache.csv"
MULTIGRID_DEMO_CSV = "projects/video/benchmarks/results/multigrid_demo.csv"
#: multigrid's target on the demo: this speed-up of the training wall clock ...
MULTIGRID_SPEEDUP = 2.5
#: ... with top-1 at most this many points below the base shape's
MULTIGRID_TOP1_DROP = 1.0

__all__ = [
    "BLOCKS", "decoded_cache_table", "precise_bn_cache_table", "gpu_multigrid_line", "gpu_throughput_line", "multigrid_demo_table",
    "throughput_decoding_table", "throughput_training_table", "video_demo_table",
]  # fmt: skip


def decoded_cache_table(path: str = DECODED_CACHE_CSV) -> str:
    """One line per machine class, torch and load: the fresh processes measured, and the ranges
    over them of ms per training clip without the cache, with it in its first pass and later,
    and the ratio uncached / cached-later."""
    groups = csv_groups(path, ("cpu", "cpu_family_model", "torch", "load", "videos"))
    rows = [
        [f"{cpu} ({fm})", torch_version, load or "nothing", videos, len(runs),
         column_span(runs, "uncached_ms", ".2f"), column_span(runs, "cached_first_ms", ".2f"),
         column_span(runs, "cached_ms", ".3f"), column_span(runs, "ratio", ".1f") + "x", run_dates(runs)]
        for (cpu, fm, torch_version, load, videos), runs in groups.items()
    ]  # fmt: skip
    return markdown_table(
        ["CPU (family/model)", "torch", "beside", "videos", "processes", "uncached ms/clip",
         "cached, first pass", "cached, later passes", "uncached / cached", "dates"],
        "lllrrrrrrl", rows,
    )  # fmt: skip


def precise_bn_cache_table(path: str = PRECISE_BN_CACHE_CSV) -> str:
    """One line per machine class, torch, load and size: the fresh processes measured, and
    the ranges over them of a precise-BN pass's seconds with a cache of its own and with the
    training loader's, and their ratio."""
    groups = csv_groups(path, ("cpu", "cpu_family_model", "torch", "load", "videos", "iters", "batch"))
    rows = [
        [f"{cpu} ({fm})", torch_version, load or "nothing", videos, f"{iters} x {batch}", len(runs),
         column_span(runs, "own_cache_s", ".2f"), column_span(runs, "shared_cache_s", ".2f"),
         column_span(runs, "ratio", ".2f") + "x", run_dates(runs)]
        for (cpu, fm, torch_version, load, videos, iters, batch), runs in groups.items()
    ]  # fmt: skip
    return markdown_table(
        ["CPU (family/model)", "torch", "beside", "videos", "batches x clips", "processes",
         "own cache, s a pass", "training's cache, s a pass", "own / training's", "dates"],
        "lllrrrrrrl", rows,
    )  # fmt: skip


def multigrid_demo_table(path: str = MULTIGRID_DEMO_CSV) -> str:
    """One line per schedule (the base shape; multigrid at each epoch factor) per machine
    class, torch, load, config and data: runs, epochs, steps, training seconds and top-1
    (ranges over the runs); for multigrid its speed-up (the base's training seconds over its
    own) and top-1 minus the base's, each within one invocation, and whether every run met
    the target (>= 2.5x at most 1 point lower)."""
    if csv_missing(path):
        return "(not measured yet)"
    groups = csv_groups(path, ("cpu", "cpu_family_model", "torch", "load", "config", "data"))
    rows = []
    for (cpu, fm, torch_version, load, _config, _data), runs in groups.items():
        base = {r["invocation"]: r for r in runs if r["schedule"] == "base"}
        for factor, rs in group_by(runs, lambda r: r["epoch_factor"]).items():
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
            rows.append([
                f"{cpu} ({fm})", torch_version, load or "nothing", label, len(rs),
                span([float(r["epochs"]) for r in rs], "g"), column_span(rs, "steps", ".0f"),
                column_span(rs, "train_s", ".0f"), column_span(rs, "top1", ".1f"), speed, drop, target,
                run_dates(rs),
            ])  # fmt: skip
    return markdown_table(
        ["CPU (family/model)", "torch", "beside", "schedule", "runs", "epochs", "optimizer steps",
         "training s", "top-1 %", "speed-up (per run)", "top-1 minus base", ">= 2.5x, within 1 point",
         "dates"],
        "llllrrrrrrrcl", rows,
    )  # fmt: skip


THROUGHPUT_CSV = "projects/video/benchmarks/results/throughput"
DEMO_RUNS_CSV = "projects/video/benchmarks/results/demo_runs.csv"


def video_demo_table(path: str = DEMO_RUNS_CSV) -> str:
    """One line per demo config, machine class, torch and load (rows of
    ``projects/video/benchmarks/demo_runs.py --csv``): runs, top-1, training seconds, seconds
    per step and the whole command's seconds, each the range over the runs."""
    if csv_missing(path):
        return "(not measured yet)"
    groups = csv_groups(path, ("config", "cpu", "cpu_family_model", "isa", "torch", "load"))
    rows = [
        [f"`{os.path.basename(config)}`", f"{cpu} ({fm})", isa, torch_version, load or "nothing", len(runs),
         column_span(runs, "top1", ".1f"), column_span(runs, "training_s", ".0f"),
         column_span(runs, "s_per_step", ".3f"), column_span(runs, "whole_s", ".0f"), run_dates(runs)]
        for (config, cpu, fm, isa, torch_version, load), runs in groups.items()
    ]  # fmt: skip
    return markdown_table(
        ["config", "CPU (family/model)", "instruction sets", "torch", "beside", "runs", "top-1 %",
         "training s", "s/step", "whole command, s", "dates"],
        "lllllrrrrrl", rows,
    )  # fmt: skip



def _median_range(values: List[float], fmt: str, unit: str = "") -> str:
    """``median (min-max)`` of ``values``, each number followed by ``unit``; the value alone
    where there is one."""

    def f(v: float) -> str:
        return format(v, fmt) + unit

    if len(values) == 1:
        return f(values[0])
    lo, hi = min(values), max(values)
    return f"{f(statistics.median(values))} ({f(lo)}-{f(hi)})"


def _invocations(runs: List[dict]) -> Dict[str, Dict[str, dict]]:
    """{invocation: {model or decoder key: row}}."""
    return {inv: {r.get("model") or (r["video_set"], r["decoder"]): r for r in rs}
            for inv, rs in group_by(runs, lambda r: r["invocation"]).items()}  # fmt: skip


def throughput_training_table(prefix: str = THROUGHPUT_CSV) -> str:
    """Training clips/s per model (rows of ``throughput.py --csv``), one table row per model,
    machine, load and setting: the invocations, clips/s and clips per CPU-second (median and
    range over the invocations), GFLOPs per clip and parameters; then per setting the ratios
    taken within each invocation: TSM over each I3D baseline, and the shift's cost against
    TSN (1 - TSM / TSN, wall clock and CPU time)."""
    path = prefix + "_training.csv"
    if csv_missing(path):
        return "(not measured yet)"
    key = ("cpu", "cpu_family_model", "torch", "device", "load", "depth", "width", "size", "frames", "batch")
    groups = csv_groups(path, key)
    head, ratios = [], []
    for (cpu, fm, torch_version, device, load, depth, width, size, frames, batch), runs in groups.items():
        setting = f"R{depth}{'' if width == '64' else f' w{width}'}, {batch} x {frames} x {size}^2"
        where = cpu if device == "cpu" else device
        for model, rs in group_by(runs, lambda r: r["model"]).items():
            cpu_s = [float(r["clips_cpu_s"]) for r in rs if r["clips_cpu_s"]]
            head.append([
                setting, f"{where} ({fm})", torch_version, load or "nothing", model, len(rs),
                _median_range([float(r["clips_s"]) for r in rs], ".2f"),
                _median_range(cpu_s, ".2f") if cpu_s else "-", column_span(rs, "gflops", ".1f"),
                column_span(rs, "params_m", ".1f"), run_dates(rs),
            ])  # fmt: skip
        inv = list(_invocations(runs).values())

        def ratio(a: str, b: str, field: str, cost: bool = False) -> str:
            vals = [float(i[a][field]) / float(i[b][field]) for i in inv if a in i and b in i and i[a][field]]
            if not vals:
                return "-"
            if cost:
                return _median_range([100 * (1 - v) for v in vals], "+.1f", "%")
            return _median_range(vals, ".2f", "x")

        ratios.append([
            setting, f"{where} ({fm})", load or "nothing", len(inv),
            ratio("TSM", "I3D 3x3x3", "clips_s"), ratio("TSM", "I3D 3x1x1", "clips_s"),
            ratio("TSM", "TSN", "clips_s", True), ratio("TSM", "TSN", "clips_cpu_s", True),
            ratio("TSM (naive shift)", "TSN", "clips_s", True),
        ])  # fmt: skip
    models = markdown_table(
        ["setting", "CPU (family/model)", "torch", "beside", "model", "runs", "clips/s", "clips per CPU-s",
         "GFLOPs/clip", "parameters (M)", "dates"],
        "lllllrrrrrl", head,
    )  # fmt: skip
    within = markdown_table(
        ["setting", "CPU (family/model)", "beside", "runs", "TSM / I3D 3x3x3 (paper 1.6x)",
         "TSM / I3D 3x1x1 (paper 2.9x)", "shift cost, wall (goal <= 3%)", "shift cost, CPU time",
         "naive shift cost, wall"],
        "lllrrrrrr", ratios,
    )  # fmt: skip
    return models + "\n\n" + within


def throughput_decoding_table(prefix: str = THROUGHPUT_CSV) -> str:
    """Decoding clips/s of one worker per decoder and video set (rows of ``throughput.py
    --decoders --csv``), per machine and load: the invocations, clips/s and clips per
    CPU-second (median and range over the invocations' medians), and per CPU-second the
    decoder over PyAV within each invocation."""
    path = prefix + "_decoding.csv"
    if csv_missing(path):
        return "(not measured yet)"
    groups = csv_groups(path, ("cpu", "cpu_family_model", "torch", "device", "load"))
    rows = []
    for (cpu, fm, torch_version, _device, load), runs in groups.items():
        inv = list(_invocations(runs).values())
        for (video_set, decoder), rs in group_by(runs, lambda r: (r["video_set"], r["decoder"])).items():
            vs = [float(i[(video_set, decoder)]["clips_cpu_s"]) / float(i[(video_set, "pyav")]["clips_cpu_s"])
                  for i in inv if (video_set, decoder) in i and (video_set, "pyav") in i]  # fmt: skip
            rel = "-" if decoder == "pyav" or not vs else _median_range(vs, ".2f", "x")
            rows.append([
                f"{cpu} ({fm})", torch_version, load or "nothing", video_set, decoder, len(rs),
                _median_range([float(r["clips_s"]) for r in rs], ".2f"),
                _median_range([float(r["clips_cpu_s"]) for r in rs], ".1f"), rel, run_dates(rs),
            ])  # fmt: skip
    return markdown_table(
        ["CPU (family/model)", "torch", "beside", "video set", "decoder", "runs", "clips/s",
         "clips per CPU-s", "/ PyAV, per CPU-s", "dates"],
        "lllllrrrrl", rows,
    )  # fmt: skip


#: the GPU check's video-throughput step (2026-11-26), one run on each of two machines
GPU_THROUGHPUT_LOGS = tuple(f"benchmarks/results/gpu_check_h100_2026-11-26/lease{k}/video-throughput.log" for k in (1, 2))
_MODEL_LINE = re.compile(r"^  (TSN|TSM|TSM \(naive shift\)|I3D 3x3x3|I3D 3x1x1) +([\d.]+) clips/s")
_RATIO_LINE = re.compile(r"^  TSM / (I3D 3x[13]x[13]): +([\d.]+)x")
_SHIFT_LINE = re.compile(r"^  shift cost vs TSN: ([+-][\d.]+)% wall.*naive shift ([+-][\d.]+)% wall")


def gpu_throughput_line(paths=GPU_THROUGHPUT_LOGS) -> str:
    """The GPU check's training clips/s per model and the printed ratios, each as the runs'
    values joined by " / ", read from the benchmark's output."""
    runs = []
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            lines = f.read().splitlines()
        run: Dict[str, str] = {}
        for line in lines:
            for pattern in (_MODEL_LINE, _RATIO_LINE):
                m = pattern.match(line)
                key = m and (m.group(1) if pattern is _MODEL_LINE else "TSM / " + m.group(1))
                if m and key not in run:
                    run[key] = m.group(2)
            m = _SHIFT_LINE.match(line)
            if m:
                run["shift"], run["naive"] = m.group(1), m.group(2)
        runs.append(run)

    def joined(key: str, unit: str = "") -> str:
        return " / ".join(r[key] + unit for r in runs)

    models = ", ".join(f"{m} {joined(m)}" for m in ("TSN", "TSM", "TSM (naive shift)", "I3D 3x3x3", "I3D 3x1x1"))
    return (f"training clips/s (runs: {len(runs)}): {models}. TSM / I3D 3x3x3 {joined('TSM / I3D 3x3x3', 'x')} "
            f"(paper 1.6x), TSM / I3D 3x1x1 {joined('TSM / I3D 3x1x1', 'x')} (paper 2.9x); the shift "
            f"{joined('shift', '%')} against TSN (goal <= 3%), the naive shift {joined('naive', '%')}.")


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
    "video-demo-runs": video_demo_table,
    "video-throughput-training": throughput_training_table,
    "video-throughput-decoding": throughput_decoding_table,
    "video-multigrid-gpu": gpu_multigrid_line,
    "video-throughput-gpu": gpu_throughput_line,
    "video-decoded-cache": decoded_cache_table,
    "video-precise-bn-cache": precise_bn_cache_table,
    "video-multigrid-demo": multigrid_demo_table,
}
