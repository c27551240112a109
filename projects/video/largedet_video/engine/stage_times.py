"""Where a video run's wall clock goes, by stage: the training steps by the shape of their
batches (the loader's wait apart), the loader's start of each epoch, multigrid's precise BN
passes and the evaluation.

:class:`StageTimesHook` records every step into a :class:`StageTimes`; after training the
trainer writes :meth:`StageTimes.summary` to ``stage_times.json`` beside ``metrics.json``
(one entry per invocation of the run) and logs :func:`format_stage_times` of it. Recording
costs two clock reads and an append per step.

A step's work is its voxels, clips x frames x height x width summed over its batches: on a
CPU a convolution's cost follows it, so ``compute_ms_per_mvoxel`` (the median step's compute
time, its data time taken out, per million voxels) is the same for every shape where the
shapes are large enough for the arithmetic to dominate.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from detectron2.engine import HookBase

__all__ = [
    "STAGE_TIMES_FILE",
    "StageTimes",
    "StageTimesHook",
    "StepShapes",
    "append_stage_times",
    "format_stage_times",
    "read_stage_times",
    "step_shapes",
]

logger = logging.getLogger(__name__)

#: the file beside metrics.json: ``{"invocations": [summary, ...]}``
STAGE_TIMES_FILE = "stage_times.json"


@dataclass(frozen=True)
class StepShapes:
    """The per-device batches of one optimizer step.

    Attributes:
        key: the batches' shapes as clips x frames x crop, ``"16x8x32"``; several batches
            of one shape ``"8*16x8x32"``; different shapes joined in order of first
            appearance, ``"3*64x8x16 + 3*32x8x23 + 2*16x8x32"``.
        voxels: clips x frames x crop^2, summed over the batches.
        epoch_start: whether one of the batches is the first of an epoch.
    """

    key: str
    voxels: int
    epoch_start: bool = False


def step_shapes(batches: Sequence[Tuple[int, int, int]], epoch_start: bool = False) -> StepShapes:
    """The :class:`StepShapes` of a step's batches, each ``(clips, frames, crop)``."""
    counts = Counter(f"{b}x{t}x{s}" for b, t, s in batches)
    key = " + ".join(name if n == 1 else f"{n}*{name}" for name, n in counts.items())
    return StepShapes(key, sum(b * t * s * s for b, t, s in batches), epoch_start)


class StageTimes:
    """Seconds of one invocation's training steps, by their :class:`StepShapes` key."""

    def __init__(self):
        self._steps: Dict[str, List[Tuple[float, float]]] = {}
        self._voxels: Dict[str, int] = {}
        self.epoch_starts = 0
        self.epoch_start_data_s = 0.0

    def add_step(self, shapes: StepShapes, step_s: float, data_s: float) -> None:
        """One step of ``step_s`` seconds (forward, backward, optimizer, the wait for data
        included), ``data_s`` of them waiting for the loader."""
        self._steps.setdefault(shapes.key, []).append((step_s, data_s))
        self._voxels[shapes.key] = shapes.voxels
        if shapes.epoch_start:
            self.epoch_starts += 1
            self.epoch_start_data_s += data_s

    def summary(self, wall_s: float, precise_bn_s: float = 0.0, precise_bn_passes: int = 0,
                evaluation_s: float = 0.0) -> dict:  # fmt: skip
        """The invocation's stages in seconds (``wall_s`` its training's wall clock, the
        final evaluation included): ``steps`` by shape key (count, seconds in all, data
        seconds, median step and compute milliseconds, voxels, compute ms per million
        voxels), their totals, the epoch starts' data seconds, precise BN, evaluation, and
        ``other_s`` (checkpoints, writers, hooks: the wall clock less the rest)."""
        steps = {}
        for key, times in self._steps.items():
            compute = statistics.median(s - d for s, d in times)
            steps[key] = {
                "steps": len(times),
                "step_s": round(sum(s for s, _ in times), 4),
                "data_s": round(sum(d for _, d in times), 4),
                "median_step_ms": round(1e3 * statistics.median(s for s, _ in times), 3),
                "median_compute_ms": round(1e3 * compute, 3),
                "voxels": self._voxels[key],
                "compute_ms_per_mvoxel": round(1e9 * compute / self._voxels[key], 4),
            }
        step_s = sum(s for times in self._steps.values() for s, _ in times)
        data_s = sum(d for times in self._steps.values() for _, d in times)
        return {
            "wall_s": round(wall_s, 3),
            "step_s": round(step_s, 3),
            "data_s": round(data_s, 3),
            "epoch_starts": self.epoch_starts,
            "epoch_start_data_s": round(self.epoch_start_data_s, 3),
            "precise_bn_s": round(precise_bn_s, 3),
            "precise_bn_passes": precise_bn_passes,
            "evaluation_s": round(evaluation_s, 3),
            "other_s": round(wall_s - step_s - precise_bn_s - evaluation_s, 3),
            "steps": steps,
        }


class StageTimesHook(HookBase):
    """Times each step into ``times``: from this hook's ``before_step`` to its ``after_step``
    (place it right after Detectron2's ``IterationTimer``, so that the other hooks' work
    after the step, precise BN and evaluation among it, stays outside), its data time the
    step's ``data_time`` in the event storage (the slowest rank's; main process only).
    ``shapes_of(iteration)`` gives the step's :class:`StepShapes`."""

    def __init__(self, times: StageTimes, shapes_of: Callable[[int], StepShapes]):
        self.times = times
        self._shapes_of = shapes_of
        self._start = 0.0
        self.train_start: Optional[float] = None

    def before_train(self):
        self.train_start = time.perf_counter()

    def before_step(self):
        self._start = time.perf_counter()

    def after_step(self):
        elapsed = time.perf_counter() - self._start
        value, at = self.trainer.storage.latest().get("data_time", (0.0, self.trainer.iter))
        data = value if at == self.trainer.iter else 0.0
        self.times.add_step(self._shapes_of(self.trainer.iter), elapsed, data)

    def wall_s(self) -> float:
        """Seconds since training started (0 before it)."""
        return 0.0 if self.train_start is None else time.perf_counter() - self.train_start


def read_stage_times(output_dir: str) -> List[dict]:
    """The invocations' summaries in ``output_dir``'s ``stage_times.json`` ([] if none)."""
    path = os.path.join(output_dir, STAGE_TIMES_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["invocations"]


def append_stage_times(output_dir: str, summary: dict) -> str:
    """Add this invocation's ``summary`` to ``output_dir``'s ``stage_times.json``."""
    invocations = read_stage_times(output_dir) + [summary]
    path = os.path.join(output_dir, STAGE_TIMES_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"invocations": invocations}, f, indent=1)
    os.replace(tmp, path)
    return path


def format_stage_times(summary: dict) -> str:
    """Two text tables of a summary: seconds and share of the wall clock per stage; per
    shape the steps, seconds, share, median step and compute ms, and compute ms per
    million voxels (its ratio to the most-voxel shape's in brackets)."""
    wall = summary["wall_s"] or float("nan")
    compute = summary["step_s"] - summary["data_s"]
    rows = [
        ("train steps: compute", compute),
        ("train steps: data", summary["data_s"] - summary["epoch_start_data_s"]),
        (f"epoch starts' data ({summary['epoch_starts']})", summary["epoch_start_data_s"]),
        (f"precise BN ({summary['precise_bn_passes']} passes)", summary["precise_bn_s"]),
        ("evaluation", summary["evaluation_s"]),
        ("other (checkpoints, writers, hooks)", summary["other_s"]),
    ]
    lines = [f"{'stage':40s} {'s':>9s} {'share':>7s}"]
    lines += [f"{name:40s} {s:9.2f} {100 * s / wall:6.1f}%" for name, s in rows]
    lines.append(f"{'wall clock':40s} {summary['wall_s']:9.2f}")
    steps = summary["steps"]
    if steps:
        ref = max(steps.values(), key=lambda v: v["voxels"])["compute_ms_per_mvoxel"]
        lines += ["", f"{'shape (clips x frames x crop)':34s} {'steps':>6s} {'s':>8s} {'share':>6s} "
                  f"{'step ms':>8s} {'compute':>8s} {'Mvoxel':>7s} {'ms/Mvoxel':>16s}"]  # fmt: skip
        for key, v in sorted(steps.items(), key=lambda kv: -kv[1]["voxels"]):
            lines.append(
                f"{key:34s} {v['steps']:6d} {v['step_s']:8.2f} {100 * v['step_s'] / wall:5.1f}% "
                f"{v['median_step_ms']:8.1f} {v['median_compute_ms']:8.1f} {v['voxels'] / 1e6:7.3f} "
                f"{v['compute_ms_per_mvoxel']:8.2f} ({v['compute_ms_per_mvoxel'] / ref:4.2f}x)"
            )
    return "\n".join(lines)
