"""Why multigrid's speed-up in the ``mg_time`` grids (base batch 128; ``mg_time16``) is what it is: each point's steps, its
cost per step and per voxel against the plain schedule's, and the time outside the steps,
generated from the grid's CSV and the ``stage_times.json`` archived beside each row
(``study/results/video/mg_time_runs/<cell>/``, :mod:`largedet_video.engine.stage_times`).

Per point (the rows :func:`largedet_study.mg_time_report.points` compares), seed by seed
against the plain schedule at 1x of the same seed, as means:

* fewer steps: the reference's iterations over the point's, the speed-up the step count
  alone would give;
* seconds a step: the point's ``step_s`` per iteration over the reference's;
* compute per voxel: the steps-weighted mean over shapes of the median step's compute time
  (its data wait left out) per million voxels (clips x frames x height x width), over the
  reference's; every multigrid shape holds about as many voxels a step as the base shape, so
  a step costs more only where a voxel does;
* precise BN and data wait: seconds (``precise_bn_s``, ``data_s``), the point's mean;
* loss at the end of multigrid's stage 0: the last logged training loss (Detectron2's
  20-step median) of the first multigrid stage in the archived ``metrics.json`` (its
  ``multigrid/stage`` scalar), the point's mean; ln 8 = 2.08 is chance on the 8-class task.
  The long cycle's stage 0 trains on its coarsest shape (the paper's factors: a quarter of
  the frames), the short cycle alone's on the base frames.

Registered in :data:`largedet_study.report.BLOCKS` as ``mg-time-profile`` and ``mg-time16-profile``.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Dict, List, Optional, Sequence

from .mg_time_report import MG_TIME16_CSV, MG_TIME64_CSV, ROOT, load, points, seed_of
from .stats import fmt

__all__ = ["ARCHIVE", "BLOCKS", "compute_per_mvoxel", "mg_time_profile", "read_invocations", "stage0_loss"]

ARCHIVE = "study/results/video/mg_time_runs"
ARCHIVE16 = "study/results/video/mg_time16_runs"
ARCHIVE64 = "study/results/video/mg_time64_runs"


def read_invocations(cell: str, archive: str = os.path.join(ROOT, ARCHIVE)) -> Optional[List[dict]]:
    """The invocations of ``cell``'s archived ``stage_times.json``; None where there is none."""
    path = os.path.join(archive, cell, "stage_times.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["invocations"]


def stage0_loss(cell: str, archive: str = os.path.join(ROOT, ARCHIVE)) -> Optional[float]:
    """The last training loss logged in multigrid stage 0 of ``cell``'s archived
    ``metrics.json``; None without the file or a stage-0 entry (a run without multigrid)."""
    path = os.path.join(archive, cell, "metrics.json")
    if not os.path.exists(path):
        return None
    last = None
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("multigrid/stage") == 0 and "total_loss" in row:
                last = float(row["total_loss"])
    return last


def compute_per_mvoxel(invocations: Sequence[dict]) -> Optional[float]:
    """The steps-weighted mean, over every shape of every invocation, of the median step's
    compute milliseconds per million voxels; None where no shape has steps."""
    weighted = [(s["steps"], s["compute_ms_per_mvoxel"]) for inv in invocations
                for s in inv.get("steps", {}).values() if s.get("steps")]  # fmt: skip
    total = sum(n for n, _ in weighted)
    return sum(n * v for n, v in weighted) / total if total else None


def _mean(values: Sequence[float]) -> Optional[float]:
    return statistics.mean(values) if values else None


def _x(value: Optional[float]) -> str:
    return "-" if value is None else fmt(value) + "x"


def _s(value: Optional[float]) -> str:
    return "-" if value is None else fmt(value, 0)


def mg_time_profile(rows: Sequence[dict], archive: str = os.path.join(ROOT, ARCHIVE)) -> str:
    """The table: per point, n, iterations, fewer steps, seconds a step and compute per voxel
    against the plain schedule at 1x (seed-paired means), precise BN and data seconds."""
    pts, cls = points(rows)
    ref = pts.get(("plain", 1.0))
    if ref is None:
        return "(no plain-schedule row of this grid yet)"
    ref_rows = {seed_of(r["cell"]): r for r in ref.rows}
    ref_voxel: Dict[int, float] = {}
    for seed, r in ref_rows.items():
        inv = read_invocations(r["cell"], archive)
        voxel = None if inv is None else compute_per_mvoxel(inv)
        if voxel is not None:
            ref_voxel[seed] = voxel
    head = ["schedule, epochs", "n", "steps", "fewer steps", "s a step, vs plain", "compute per voxel, vs plain",
            "precise BN s", "data s", "loss, end of stage 0"]  # fmt: skip
    lines = [f"Machine class {cls}; seed-paired means against the plain step schedule at 1x the epochs.", "",
             "| " + " | ".join(head) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    missing = []
    for key, p in pts.items():
        fewer, per_step, per_voxel = [], [], []
        for r in p.rows:
            seed = seed_of(r["cell"])
            base = ref_rows.get(seed)
            if base is None:
                continue
            its, base_its = int(r["iterations"]), int(base["iterations"])
            fewer.append(base_its / its)
            if r.get("step_s") and base.get("step_s"):  # "" where an invocation was not timed
                per_step.append((float(r["step_s"]) / its) / (float(base["step_s"]) / base_its))
            inv = read_invocations(r["cell"], archive)
            voxel = None if inv is None else compute_per_mvoxel(inv)
            if voxel is None:
                missing.append(r["cell"])
            elif seed in ref_voxel:
                per_voxel.append(voxel / ref_voxel[seed])
        steps = sorted({int(r["iterations"]) for r in p.rows})
        pbn, data = (_mean([float(r[c]) for r in p.rows if r.get(c)]) for c in ("precise_bn_s", "data_s"))
        losses = [v for v in (stage0_loss(r["cell"], archive) for r in p.rows) if v is not None]
        loss = "-" if not losses else f"{_mean(losses):.2f}"
        lines.append(f"| {p.label} | {len(p.rows)} | {', '.join(map(str, steps))} | {_x(_mean(fewer))} | "
                     f"{_x(_mean(per_step))} | {_x(_mean(per_voxel))} | {_s(pbn)} | {_s(data)} | {loss} |")  # fmt: skip
    if missing:
        lines += ["", "Without an archived stage_times.json: " + ", ".join(f"`{c}`" for c in missing) + "."]
    return "\n".join(lines)


BLOCKS = {
    "mg-time-profile": lambda: mg_time_profile(load()),
    "mg-time16-profile": lambda: mg_time_profile(load(os.path.join(ROOT, MG_TIME16_CSV)), os.path.join(ROOT, ARCHIVE16)),
    "mg-time64-profile": lambda: mg_time_profile(load(os.path.join(ROOT, MG_TIME64_CSV)), os.path.join(ROOT, ARCHIVE64)),
}
