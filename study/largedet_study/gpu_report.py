"""The GPU check's figures in benchmarks/RESULTS.md, generated from the committed outputs.

A GPU lease's outputs are committed under ``benchmarks/results/gpu_check_<gpu>_<date>/``:
``suite/`` is what ``benchmarks/gpu_check.py`` wrote (``results.json``, one log per step),
``repeats/`` the logs of the same steps' scripts run again in fresh processes on the same
machine. Every script prints its figures as one ``GPU-CHECK-FIGURES {json}`` line, so a
repeat is read exactly like a suite step. The blocks below are registered in
:data:`largedet_study.report.BLOCKS` (names ``gpu-<date>-<what>``).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
from typing import Callable, Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIGURES_PREFIX = "GPU-CHECK-FIGURES "
#: the issue's goals: TSM's step at most this times TSN's; largedet's Trainer at least this
#: times DefaultTrainer's images/s; multigrid at least this speed-up at equal epochs
SHIFT_GOAL = 1.03
TRAINER_GOAL = 0.98
MULTIGRID_GOAL = 3.0

__all__ = ["BLOCKS", "lease_runs"]


def _figures_of_log(path: str) -> dict:
    with open(path) as f:
        lines = [line for line in f if line.startswith(FIGURES_PREFIX)]
    if not lines:
        raise ValueError(f"{path}: no {FIGURES_PREFIX.strip()} line")
    return json.loads(lines[-1][len(FIGURES_PREFIX) :])


def lease_runs(folder: str, step: str, repeat_glob: str) -> List[dict]:
    """The figures of ``step`` in the suite's results.json, then of each repeat log matching
    ``repeat_glob`` (sorted by name), each with ``"source"`` (a path relative to ``folder``)."""
    base = os.path.join(ROOT, folder)
    with open(os.path.join(base, "suite", "results.json")) as f:
        suite = json.load(f)["steps"][step]
    if suite.get("status") != "passed":
        raise ValueError(f"{folder}: step {step} did not pass ({suite.get('status')})")
    runs = [dict(suite["figures"], source="suite/" + suite["log"])]
    for path in sorted(glob.glob(os.path.join(base, "repeats", repeat_glob))):
        runs.append(dict(_figures_of_log(path), source=os.path.relpath(path, base)))
    return runs


def _span(values: List[float], digits: int = 2) -> str:
    values = sorted(values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values[0]:.{digits}f}-{values[-1]:.{digits}f}"


def shift_table(folder: str) -> str:
    """TSM's step time over TSN's per shift implementation and precision: the median ratio of
    each run, then the spread of the runs' medians."""
    runs = lease_runs(folder, "video-shift", "shift_cost_*.log")
    keys = sorted(runs[0]["ratio"], key=lambda k: (k.split("/")[0] != "none", k))
    lines = [
        f"| precision / shift | TSM / TSN, each run's median ({len(runs)} runs) | spread of the medians "
        "| shift ms (median of runs) | equal to the slices shift |",
        "| --- | --- | ---: | ---: | :---: |",
    ]
    for key in keys:
        amp, impl = key.split("/")
        ratios = [r["ratio"][key] for r in runs]
        shift_ms = statistics.median(r["shift_ms"][key] for r in runs)
        exact = all(r["exact"][key] for r in runs)
        name = {"none": "fp32", "bf16": "bf16"}[amp]
        lines.append(
            f"| {name} / {impl} | {', '.join(f'{x:.3f}' for x in ratios)} | {_span(ratios)} "
            f"| {shift_ms:.1f} | {'yes' if exact else 'no'} |"
        )
    best = {
        amp: min((k for k in keys if k.startswith(amp + "/")), key=lambda k: max(r["ratio"][k] for r in runs))
        for amp in ("none", "bf16")
    }
    met = [k for k in keys if max(r["ratio"][k] for r in runs) <= SHIFT_GOAL]
    lines.append("")
    lines.append(
        f"Goal TSM <= {SHIFT_GOAL:.2f}x TSN: met by {', '.join(met) if met else 'none'}"
        + "; the lowest: "
        + ", ".join(
            f"{'fp32' if amp == 'none' else amp} {k.split('/')[1]} "
            f"{_span([r['ratio'][k] for r in runs])}"
            for amp, k in best.items()
        )
        + "."
    )
    return "\n".join(lines)


def trainer_table(folder: str) -> str:
    """largedet's Trainer against Detectron2's DefaultTrainer per images per GPU and run."""
    runs = lease_runs(folder, "trainer-vs-detectron2", "trainer_overhead*.log")
    lines = [
        "| images per GPU | run | rounds | Detectron2 images/s (rounds) | largedet images/s (rounds) "
        "| ratio of the medians | per-round ratios |",
        "| ---: | --- | ---: | --- | --- | ---: | --- |",
    ]
    for b in sorted({b for r in runs for b in r["ims_per_batch"]}):
        for r in runs:
            if f"ratio_b{b}" not in r:
                lines.append(f"| {b} | `{r['source']}` | 0 | not reached (time limit) | | | |")
                continue
            d, l_ = r[f"detectron2_images_per_s_range_b{b}"], r[f"largedet_images_per_s_range_b{b}"]
            rr = r[f"round_ratio_range_b{b}"]
            lines.append(
                f"| {b} | `{r['source']}` | {r[f'rounds_b{b}']} "
                f"| {r[f'detectron2_images_per_s_b{b}']:.1f} ({d[0]:.1f}-{d[1]:.1f}) "
                f"| {r[f'largedet_images_per_s_b{b}']:.1f} ({l_[0]:.1f}-{l_[1]:.1f}) "
                f"| {r[f'ratio_b{b}']:.3f} | {rr[0]:.2f}-{rr[1]:.2f} |"
            )
    ratios = [r[k] for r in runs for k in r if k.startswith("ratio_b")]
    lows = [r[k][0] for r in runs for k in r if k.startswith("round_ratio_range_b")]
    highs = [r[k][1] for r in runs for k in r if k.startswith("round_ratio_range_b")]
    lines.append("")
    lines.append(
        f"Goal largedet / Detectron2 >= {TRAINER_GOAL:.2f}: the ratio of the medians is "
        f"{_span(ratios, 3)} in all {len(ratios)} measurements, "
        + ("at or above" if min(ratios) >= TRAINER_GOAL else "not always above")
        + f" the goal; the per-round ratios span {min(lows):.2f}-{max(highs):.2f}, so these "
        "rounds resolve no difference of a few percent either way."
    )
    return "\n".join(lines)


def loader_table(folder: str) -> str:
    """Detectron2's training loader alone: images/s per worker count, and what one GPU needs."""
    (r,) = lease_runs(folder, "loader-speed", "loader_speed*.log")
    lines = [
        "| loader workers | images/s | per worker |",
        "| ---: | ---: | ---: |",
    ]
    for w in r["workers"]:
        if f"images_per_s_w{w}" in r:
            lines.append(
                f"| {w} | {r[f'images_per_s_w{w}']:.0f} | {r[f'images_per_s_per_worker_w{w}']:.1f} |"
            )
    lines.append("")
    lines.append(
        f"One image through the mapper: {r['mapper_ms']:.1f} ms ({r['decode_share']:.0%} JPEG "
        f"decoding, {r['augment_share']:.0%} resizing and flipping), {r['jpeg_kb']:.0f} kB JPEGs "
        f"({r['cpu']}, {r['cpu_count']} cores). At {r['train_images_per_s']:.0f} "
        f"training images/s per GPU: {r['workers_per_gpu']:.2f} workers "
        f"({r['cpu_cores_per_gpu']:.2f} cores) per GPU, {8 * r['cpu_cores_per_gpu']:.1f} cores for "
        "the loaders of 8 GPUs."
    )
    return "\n".join(lines)


def multigrid_table(folder: str) -> str:
    """Multigrid's speed-up at equal epochs on TSM-R50: steps saved, time saved, and the cost of
    sub-batch BN per shape."""
    (r,) = lease_runs(folder, "multigrid-r50", "multigrid_speed*.log")
    step = {(s["model"], s["shape"]): s for s in r["shapes"]}
    shapes = [s["shape"] for s in r["shapes"] if s["model"] == "base"]
    lines = [
        "| shape (clips x frames x crop) | plain BN ms/step | sub-batch BN ms/step | sub-batch / plain |",
        "| --- | ---: | ---: | ---: |",
    ]
    for shape in shapes:
        a, b = step[("base", shape)], step.get(("multigrid", shape))
        if b is None:
            continue
        lines.append(
            f"| {shape} | {a['step_ms']:.1f} | {b['step_ms']:.1f} | {b['step_ms'] / a['step_ms']:.2f} |"
        )
    lines.append("")
    lines.append("| schedule | epochs | steps per device | hours of steps | speed-up over the base |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    base_s = r["schedules"]["base"]["train_s"]
    for name, s in r["schedules"].items():
        lines.append(
            f"| {name} | {s['epochs']} | {s['total_batches']:,} | {s['train_s'] / 3600:.1f} "
            f"| {base_s / s['train_s']:.2f}x |"
        )
    speedup = r["speedup"]["1"]
    costs = [step[("multigrid", sh)]["step_ms"] / step[("base", sh)]["step_ms"] for sh in shapes
             if ("multigrid", sh) in step and sh != shapes[-1]]
    lines.append("")
    lines.append(
        f"Sub-batch BN adds {min(costs) - 1:.0%}-{max(costs) - 1:.0%} to the step time of every "
        f"shape but the base one (whose batch is a single group); with plain BN the speed-up "
        f"at equal epochs would be {r['speedup_plain_bn']['1']:.2f}x."
    )
    lines.append(
        f"Goal >= {MULTIGRID_GOAL:.0f}x at equal epochs (sub-batch BN, as the config trains): "
        f"{speedup:.2f}x, {'met' if speedup >= MULTIGRID_GOAL else 'missed'} (one run; "
        f"step times median of {r['rounds']} rounds, data loading excluded)."
    )
    return "\n".join(lines)


def cuda_tests_line(folder: str) -> str:
    (r,) = lease_runs(folder, "cuda-tests", "cuda_tests*.log")
    return (
        f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
        f"{r['skipped']} skipped"
    )


_ROUND2 = "benchmarks/results/gpu_check_h100_2026-11-27"

BLOCKS: Dict[str, Callable[[], str]] = {
    "gpu-2026-11-27-tests": lambda: cuda_tests_line(_ROUND2),
    "gpu-2026-11-27-shift": lambda: shift_table(_ROUND2),
    "gpu-2026-11-27-trainer": lambda: trainer_table(_ROUND2),
    "gpu-2026-11-27-loader": lambda: loader_table(_ROUND2),
    "gpu-2026-11-27-multigrid": lambda: multigrid_table(_ROUND2),
}
