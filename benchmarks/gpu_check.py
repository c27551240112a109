#!/usr/bin/env python3
"""The GPU check: largedet's CUDA tests and GPU benchmarks in one go, on a fresh GPU machine.

    python benchmarks/gpu_check.py [--output output/gpu_check] [--steps NAME,...] [--force]
        [--budget SECONDS] [--wheels .whl] [--archive FILE.tar.gz]
    python benchmarks/gpu_check.py --dry-run      # the same steps on tiny sizes, on the CPU
    python benchmarks/gpu_check.py --list         # the steps and their commands
    python benchmarks/gpu_check.py --fetch-wheels .whl   # here, with the package registry

Each step runs one of the repository's scripts in a subprocess, from the repository root,
under its own time limit (each under 10 minutes, about 34 minutes together), its stdout and
stderr in ``OUTPUT/<step>.log``. After every step ``OUTPUT/results.json`` is rewritten (per
step: the command, exit code, status, wall-clock seconds, the figures parsed from its output,
the device as ``torch.cuda.get_device_name`` names it, torch and CUDA versions, the date; and
the environment) with ``OUTPUT/summary.md``, a table for ``benchmarks/RESULTS.md``. A
failing step does not stop the others. Run again on the same ``OUTPUT``, the steps already
recorded as passed (exit code 0 and every expected figure found) are skipped (``--force``
runs them again), so a suite split over several commands, by ``--steps`` or by ``--budget``
(no step starts after that many seconds, and a running one is stopped there), continues
where it stopped. ``--archive`` packs the results and logs into one file after every step,
for machines that give back only a few files.

The steps (``--list`` prints their commands):

    cuda-tests             pytest -m cuda tests/cuda: AMP with accumulation, the optimizers'
                           CUDA paths, SyncBN in an NCCL group, sub-batch BN, R-CNN training
    optimizer-step         benchmarks/optimizer_step.py: PMD-LAMB, eager and compiled, vs fused
                           AdamW (<= 1.1x)
    train-throughput-bf16  benchmarks/train_throughput.py, R50-FPN at 800x1067, AMP bfloat16,
                           SGD vs PMD-LAMB, K=1 vs K=8, profiled
    train-throughput-fp16  the same with AMP float16 (gradient scaler)
    video-throughput       projects/video/benchmarks/throughput.py: TSM vs TSN vs I3D, 8x224^2
    multigrid              projects/video/benchmarks/multigrid.py: speed-up at 1.5x and 1.0x epochs

Nothing is downloaded while it runs: the models start from random weights and the data
are generated. The children find the repository (and ``projects/video``) on PYTHONPATH.
Packages a plain CUDA image lacks (Detectron2, fvcore, PyAV, ...) are installed, only where
they do not import, from the wheels in ``--wheels`` into a private folder (``--site``) that
goes on the children's PYTHONPATH; ``--fetch-wheels DIR`` puts those wheels in DIR on a
machine with the package registry (the versions installed there; pure-Python packages that
are published only as source are built into wheels). With ``--dry-run`` every step runs its
script on the CPU on tiny sizes, so that the suite cannot rot between GPU runs
(``tests/benchmarks/test_gpu_check.py`` does that).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIDEO_PROJECT = os.path.join(REPO, "projects", "video")

#: seconds a dry-run step may take (on a busy 2-core CPU)
DRY_RUN_TIMEOUT_S = 300
#: with --budget, no step starts with less than this left
MIN_STEP_SECONDS = 60
#: seconds between SIGTERM and SIGKILL for a step past its limit
KILL_GRACE_S = 10

# The detector of the dry runs: largedet's narrow ResNet-10 (16-128 channels) under a
# 32-channel FPN, a 64-wide box head, instead of R50-FPN.
TINY_DETECTOR = (
    "MODEL.BACKBONE.NAME", "build_basic_resnet_fpn_backbone",
    "MODEL.RESNETS.DEPTH", "10",
    "MODEL.RESNETS.STEM_OUT_CHANNELS", "16",
    "MODEL.RESNETS.RES2_OUT_CHANNELS", "16",
    "MODEL.FPN.OUT_CHANNELS", "32",
    "MODEL.ROI_BOX_HEAD.FC_DIM", "64",
)  # fmt: skip

# The multigrid demo shrunk: 64 videos of 12 frames (48x32), 4 clips x 4 frames x 32^2 per
# step, 2 epochs (32 steps, LR step after epoch 1), ResNet-10 TSM at width 8, 1 test view.
TINY_MULTIGRID = (
    "DATASETS.MOVING_SHAPES.NUM_TRAIN", "64", "DATASETS.MOVING_SHAPES.NUM_VAL", "4",
    "DATASETS.MOVING_SHAPES.NUM_FRAMES", "12",
    "DATASETS.MOVING_SHAPES.WIDTH", "48", "DATASETS.MOVING_SHAPES.HEIGHT", "32",
    "MODEL.VIDEO.RESNET.DEPTH", "10", "MODEL.VIDEO.RESNET.WIDTH", "8",
    "INPUT.VIDEO.NUM_FRAMES", "4", "INPUT.VIDEO.TRAIN_CROP_SIZE", "32",
    "INPUT.VIDEO.TEST_SHORT_SIDE", "32", "INPUT.VIDEO.TEST_CROP_SIZE", "32",
    "INPUT.VIDEO.TEST_NUM_CLIPS", "1", "INPUT.VIDEO.TEST_NUM_CROPS", "1",
    "DATALOADER.NUM_WORKERS", "0",
    "SOLVER.IMS_PER_BATCH", "4", "SOLVER.STEPS", "(16,)", "SOLVER.MAX_ITER", "32",
    "SOLVER.WARMUP_ITERS", "0", "SOLVER.CHECKPOINT_PERIOD", "1000",
    "TEST.PRECISE_BN.NUM_ITER", "1", "MULTIGRID.BN_BASE_SIZE", "2",
)  # fmt: skip

# Detectron2's model-zoo training speed of faster_rcnn_R_50_FPN_1x: 0.210 s/iteration for
# 16 images on 8 V100s.
MODEL_ZOO_IMAGES_PER_S = 16 / 0.210 / 8

# Packages the steps import that a plain CUDA image may lack: (distribution, module it
# provides). sal-detectron2 is Detectron2 (see tools/install_detectron2.py): its wheel is
# tagged for CPython 3.10 and installed as such; its compiled extension does not load on
# another Python, which Faster and Mask R-CNN do not need.
DEVICE_PACKAGES = (
    ("sal-detectron2", "detectron2"),
    ("fvcore", "fvcore"),
    ("iopath", "iopath"),
    ("yacs", "yacs"),
    ("termcolor", "termcolor"),
    ("omegaconf", "omegaconf"),
    ("hydra-core", "hydra"),
    ("antlr4-python3-runtime", "antlr4"),
    ("pycocotools", "pycocotools"),
    ("av", "av"),
    ("setuptools", "pkg_resources"),
    ("portalocker", "portalocker"),
    ("tabulate", "tabulate"),
    ("cloudpickle", "cloudpickle"),
)
DETECTRON2_WHEEL_PYTHON = "3.10"
DETECTRON2_VERSION = "0.7.2"
# Modules every step needs, beside DEVICE_PACKAGES' (the image's own: torch and the rest).
BASE_MODULES = ("torch", "torchvision", "numpy", "cv2", "PIL", "yaml", "tqdm", "pytest")
PROJECT_MODULES = ("largedet", "largedet_video")

# The figures of one step's output: name -> value (numbers, strings, lists, dicts).
Figures = Dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One command of the suite. ``gpu_args`` / ``dry_args``: its arguments after
    ``python`` (``{out}`` stands for the output folder); ``parse`` reads its figures from
    its output; a step passes when it exits with 0 and ``required`` (plus, on the GPU,
    ``required_on_gpu``) are among them; ``summarize`` makes the summary's cell."""

    name: str
    what: str
    gpu_args: Tuple[str, ...]
    dry_args: Tuple[str, ...]
    timeout_s: int
    parse: Callable[[str, str], Figures]
    summarize: Callable[[Figures], str]
    required: Tuple[str, ...]
    required_on_gpu: Tuple[str, ...] = ()

    def args(self, dry_run: bool, out: str) -> List[str]:
        return [a.format(out=out) for a in (self.dry_args if dry_run else self.gpu_args)]


# --- parsing the scripts' output ------------------------------------------------------


def _number(text: str) -> float:
    return float(text.rstrip("x%"))


def parse_pytest(output: str, out: str) -> Figures:
    """Counts from the JUnit XML of ``pytest --junitxml {out}/cuda-tests.xml``, and the
    names of the tests that failed."""
    root = ET.parse(os.path.join(out, "cuda-tests.xml")).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}  # beside the outcome: system-out, properties
        outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        if outcome in ("failure", "error"):
            counts["failed" if outcome == "failure" else "errors"] += 1
            failed.append(name)
        elif outcome == "skipped":
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failed_tests": failed}


def summarize_pytest(f: Figures) -> str:
    text = (
        f"{f['passed']} passed, {f['failed']} failed, {f['errors']} errors, {f['skipped']} skipped"
    )
    if f.get("failed_tests"):
        text += "; failed: " + ", ".join(f["failed_tests"])
    return text


_OPTIMIZER_ROW = re.compile(
    r"^(?P<name>\S.*?)\s+(?P<ms>\d+\.\d)\s+(?P<ratio>\d+\.\d+)x\s+(?P<paired>\d+\.\d+)x\s"
)
_FUSED = re.compile(
    r"^(?P<name>PMD-LAMB \((?:multi-tensor|compiled)\)) vs AdamW\(fused=True\): "
    r"median (?P<med>[\d.]+)x, paired (?P<paired>[\d.]+)x",
    re.M,
)
_FIRST_STEP = re.compile(r"^first step, compilation included \(s\): (?P<rows>.+)$", re.M)
_PROFILE = re.compile(
    r"^profile (?P<name>.+?): (?P<kernels>[\d.]+) kernels per step, (?P<kernel_ms>[\d.]+) ms of "
    r"kernels in (?P<wall_ms>[\d.]+) ms wall \([\d.]+%\); at least (?P<gb>[\d.]+) GB moved per "
    r"step \((?P<gbps>[\d.]+) GB/s over the kernels' time\)$",
    re.M,
)


def parse_optimizer_step(output: str, out: str) -> Figures:
    """benchmarks/optimizer_step.py: per optimizer its median step (ms) and its median and
    paired ratios to AdamW(foreach=True); PMD-LAMB against fused AdamW."""
    figures: Figures = {}
    rows = [m for m in map(_OPTIMIZER_ROW.match, output.splitlines()) if m]
    if rows:
        figures["step_ms"] = {m["name"]: float(m["ms"]) for m in rows}
        figures["vs_adamw_foreach"] = {m["name"]: float(m["ratio"]) for m in rows}
        figures["vs_adamw_foreach_paired"] = {m["name"]: float(m["paired"]) for m in rows}
    params = re.search(r": ([\d.]+)M trainable parameters", output)
    if params:
        figures["trainable_parameters_m"] = float(params[1])
    for fused in _FUSED.finditer(output):
        key = "pmd_lamb_compiled" if "compiled" in fused["name"] else "pmd_lamb"
        figures[f"{key}_vs_fused_adamw"] = float(fused["med"])
        figures[f"{key}_vs_fused_adamw_paired"] = float(fused["paired"])
    profiles = {
        m["name"]: {
            "kernels_per_step": float(m["kernels"]),
            "kernel_ms": float(m["kernel_ms"]),
            "wall_ms": float(m["wall_ms"]),
            "least_gb": float(m["gb"]),
            "gb_per_s": float(m["gbps"]),
        }
        for m in _PROFILE.finditer(output)
    }
    if profiles:
        figures["profile"] = profiles
    first = _FIRST_STEP.search(output)
    if first:
        figures["first_step_s"] = {
            name: float(value)
            for name, value in re.findall(r"(\S.*?) ([\d.]+)(?:, |$)", first["rows"])
        }
    return figures


def summarize_optimizer_step(f: Figures) -> str:
    ms = f["step_ms"]
    fused = ms.get("AdamW(fused=True)")
    if fused is None:
        return ", ".join(f"{name} {value:.1f} ms" for name, value in ms.items())
    others = ", ".join(
        f"{name} {value / fused:.2f}x" for name, value in ms.items() if name != "AdamW(fused=True)"
    )
    compiled = ""
    if "pmd_lamb_compiled_vs_fused_adamw" in f:
        compiled = (
            f"; compiled {f['pmd_lamb_compiled_vs_fused_adamw']:.2f}x (first step "
            f"{f.get('first_step_s', {}).get('PMD-LAMB (compiled)', float('nan')):.1f} s)"
        )
    return (
        f"PMD-LAMB {f['pmd_lamb_vs_fused_adamw']:.2f}x fused AdamW (paired "
        f"{f['pmd_lamb_vs_fused_adamw_paired']:.2f}x; target <= 1.1x){compiled}; fused AdamW "
        f"{fused:.1f} ms; against it (medians): {others}"
    )


_RUN_ROW = re.compile(
    r"^\s+(?P<run>sgd|pmdlamb|pmdlamb_k8)\s+\S+\s+K=\d+\s+(?P<rate>[\d.e+]+) images/s"
)
_PROFILE_HEAD = re.compile(
    r"top 3 operators by self (?P<where>CUDA|CPU) time \(of (?P<total>[\d.]+) ms\)"
)
_PROFILE_ROW = re.compile(r"^\s+\d\. (?P<op>.+?)  (?P<ms>[\d.]+) ms  (?P<pct>[\d.]+)%$")


def parse_train_throughput(output: str, out: str) -> Figures:
    """benchmarks/train_throughput.py: images/s of each run, the two ratios, the per-GPU
    figure with AMP, and the profile's top three operators."""
    figures: Figures = {}
    lines = output.splitlines()
    rates = {m["run"]: float(m["rate"]) for m in map(_RUN_ROW.match, lines) if m}
    if rates:
        figures["images_per_s"] = rates
    for key, pattern in (
        ("pmdlamb_vs_sgd", r"PMD-LAMB / SGD \(K=1\): ([\d.]+) wall-clock"),
        ("k8_vs_k1", r"K=8 / K=1 \(PMD-LAMB\): ([\d.]+) wall-clock"),
        ("per_gpu_images_per_s", r"per GPU with AMP: ([\d.]+) images/s"),
    ):
        found = re.search(pattern, output)
        if found:
            figures[key] = float(found[1])
    for i, line in enumerate(lines):
        head = _PROFILE_HEAD.search(line)
        if not head:
            continue
        top = [m for m in map(_PROFILE_ROW.match, lines[i + 1 : i + 4]) if m]
        figures[f"profile_top3_{head['where'].lower()}"] = [
            {"op": m["op"], "ms": float(m["ms"]), "percent": float(m["pct"])} for m in top
        ]
        figures[f"profile_total_ms_{head['where'].lower()}"] = float(head["total"])
    return figures


def summarize_train_throughput(f: Figures) -> str:
    rates = f["images_per_s"]
    text = (
        f"SGD {rates['sgd']:.3g}, PMD-LAMB {rates['pmdlamb']:.3g}, PMD-LAMB K=8 "
        f"{rates['pmdlamb_k8']:.3g} images/s (Detectron2 model zoo: "
        f"{MODEL_ZOO_IMAGES_PER_S:.1f} per V100); PMD-LAMB / SGD {f['pmdlamb_vs_sgd']:.3f}, "
        f"K=8 / K=1 {f['k8_vs_k1']:.3f} (targets >= 0.97)"
    )
    where = "cuda" if "profile_top3_cuda" in f else "cpu"
    top = f.get(f"profile_top3_{where}")
    if top:
        ops = ", ".join(f"{t['op']} {t['percent']:.0f}%" for t in top)
        text += f"; top 3 by self {where.upper()} time: {ops}"
    return text


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
    for key, pattern in (
        ("tsm_vs_i3d_3x3x3", r"TSM / I3D 3x3x3:\s+([\d.]+)x"),
        ("tsm_vs_i3d_3x1x1", r"TSM / I3D 3x1x1:\s+([\d.]+)x"),
        ("shift_cost_pct", r"shift cost vs TSN: ([+-]?[\d.]+)% wall"),
        ("naive_shift_cost_pct", r"naive shift ([+-]?[\d.]+)% wall"),
    ):
        found = re.search(pattern, output)
        if found:
            figures[key] = float(found[1])
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


_FIGURES_LINE = "GPU-CHECK-FIGURES "


def parse_figures_line(output: str, out: str) -> Figures:
    """The scripts written for the check end with one line ``GPU-CHECK-FIGURES {json}``:
    their figures as they computed them (the last such line counts)."""
    found = [line for line in output.splitlines() if line.startswith(_FIGURES_LINE)]
    return json.loads(found[-1][len(_FIGURES_LINE) :]) if found else {}


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_compact(v) for v in value) + "]"
    return str(value)


def summarize_figures(keys: Sequence[str]) -> Callable[[Figures], str]:
    """A summary cell of the figures ``keys`` (those present), compactly."""

    def summarize(f: Figures) -> str:
        return "; ".join(f"{key} {_compact(f[key])}" for key in keys if key in f)

    return summarize


def _train_throughput_step(amp: str, short: str) -> Step:
    return Step(
        name=f"train-throughput-{short}",
        what=f"R50-FPN training images/s, AMP {amp}, SGD vs PMD-LAMB, K=1 vs K=8, profiled",
        gpu_args=(
            "benchmarks/train_throughput.py", "--device", "cuda", "--amp", amp,
            "--ims-per-device", "2", "--image-size", "800", "--image-width", "1067",
            "--rounds", "10", "--warmup-rounds", "2", "--profile",
        ),
        dry_args=(
            "benchmarks/train_throughput.py", "--device", "cpu", "--amp", amp,
            "--ims-per-device", "1", "--image-size", "32", "--rounds", "1",
            "--warmup-rounds", "0", "--profile", *TINY_DETECTOR,
        ),
        timeout_s=300,
        parse=parse_train_throughput,
        summarize=summarize_train_throughput,
        required=("images_per_s", "pmdlamb_vs_sgd", "k8_vs_k1", "profile_top3_cpu"),
        required_on_gpu=("per_gpu_images_per_s", "profile_top3_cuda"),
    )  # fmt: skip


STEPS: Tuple[Step, ...] = (
    Step(
        name="cuda-tests",
        what="the CUDA tests (pytest -m cuda tests/cuda)",
        gpu_args=(
            "-m", "pytest", "-m", "cuda", "tests/cuda", "-v", "-p", "no:cacheprovider",
            "--junitxml", "{out}/cuda-tests.xml",
        ),
        dry_args=(
            "-m", "pytest", "-m", "cuda", "tests/cuda", "-v", "-p", "no:cacheprovider",
            "--junitxml", "{out}/cuda-tests.xml",
        ),
        timeout_s=360,
        parse=parse_pytest,
        summarize=summarize_pytest,
        required=("passed", "failed", "skipped"),
    ),
    Step(
        name="video-shift",
        what="TSM's shift against TSN per shift implementation, R50 8x8x224^2, fp32 and bf16",
        gpu_args=(
            "projects/video/benchmarks/shift_cost.py", "--device", "cuda", "--amp", "none",
            "bf16", "--rounds", "16", "--steps", "10", "--max-seconds", "70",
        ),
        dry_args=(
            "projects/video/benchmarks/shift_cost.py", "--device", "cpu", "--depth", "10",
            "--width", "8", "--size", "32", "--batch", "2", "--steps", "1", "--rounds", "1",
            "--warmup", "1", "--shift-reps", "1",
        ),
        timeout_s=110,
        parse=parse_figures_line,
        summarize=summarize_figures(("ratio", "ratio_range", "shift_ms", "exact", "errors")),
        required=("ratio", "step_ms", "exact"),
    ),
    Step(
        name="trainer-vs-detectron2",
        what="largedet's Trainer against Detectron2's DefaultTrainer, R50-FPN, AMP, 2 and 4 images",
        gpu_args=(
            "benchmarks/trainer_overhead.py", "--config", "configs/r50_fpn_bs16_sgd.yaml",
            "--ims-per-batch", "2", "4", "--coco-images", "512", "--rounds", "6", "--iters", "25",
            "--warmup-rounds", "1", "--max-seconds", "120", "MODEL.DEVICE", "cuda",
            "MODEL.WEIGHTS", "", "SOLVER.AMP.ENABLED", "True", "SOLVER.IMS_PER_DEVICE", "0",
            "SOLVER.BASE_LR", "1e-12", "SEED", "0", "DATALOADER.NUM_WORKERS", "8",
        ),
        dry_args=(
            "benchmarks/trainer_overhead.py", "--config", "configs/r50_fpn_bs16_sgd.yaml",
            "--ims-per-batch", "1", "2", "--coco-images", "4", "--rounds", "1", "--iters", "1",
            "--warmup-rounds", "0", "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "",
            "SOLVER.IMS_PER_DEVICE", "0", "SEED", "0", "DATALOADER.NUM_WORKERS", "0",
            "INPUT.MIN_SIZE_TRAIN", "(32,)", "INPUT.MAX_SIZE_TRAIN", "48", *TINY_DETECTOR,
        ),
        timeout_s=160,
        parse=parse_figures_line,
        summarize=summarize_figures(
            ("largedet_images_per_s_b2", "detectron2_images_per_s_b2", "ratio_b2",
             "round_ratio_range_b2", "largedet_images_per_s_b4", "detectron2_images_per_s_b4",
             "ratio_b4", "round_ratio_range_b4")
        ),
        required=("ratio_min",),
    ),
    Step(
        name="loader-speed",
        what="Detectron2's training loader alone on the machine's cores, COCO-size JPEGs",
        gpu_args=(
            "benchmarks/loader_speed.py", "--images", "512", "--workers", "1", "2", "4", "8",
            "16", "--images-per-worker", "150", "--single-images", "64",
            "--train-images-per-s", "40", "--max-seconds", "45",
        ),
        dry_args=(
            "benchmarks/loader_speed.py", "--images", "6", "--workers", "0", "1",
            "--ims-per-batch", "2", "--images-per-worker", "3", "--warmup-images-per-worker",
            "2", "--single-images", "3", "--train-images-per-s", "2.5",
            "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
        ),
        timeout_s=90,
        parse=parse_figures_line,
        summarize=summarize_figures(
            ("mapper_ms", "decode_share", "augment_share", "images_per_s_w1", "images_per_s_w8",
             "images_per_s_w16", "workers_per_gpu", "cpu_cores_per_gpu")
        ),
        required=("mapper_ms", "workers_per_gpu"),
    ),
    Step(
        name="multigrid-r50",
        what="multigrid's speed-up at equal epochs from step times, TSM-R50 at 8x224^2",
        gpu_args=(
            "projects/video/benchmarks/multigrid_speed.py", "--device", "cuda", "--plain-bn-too",
            "--rounds", "12", "--steps", "5", "--max-seconds", "60",
        ),
        dry_args=(
            "projects/video/benchmarks/multigrid_speed.py", "--device", "cpu", "--plain-bn-too",
            "--steps", "1", "--warmup", "1", "--rounds", "1",
            "MODEL.VIDEO.RESNET.DEPTH", "10", "MODEL.VIDEO.RESNET.WIDTH", "8",
            "INPUT.VIDEO.TRAIN_CROP_SIZE", "32", "SOLVER.IMS_PER_DEVICE", "2",
            "MULTIGRID.BN_BASE_SIZE", "2",
        ),
        timeout_s=100,
        parse=parse_figures_line,
        summarize=summarize_figures(("speedup", "speedup_plain_bn", "batch_ratio",
                                     "subbatch_bn_cost", "errors")),
        required=("speedup", "batch_ratio", "shapes"),
    ),
    Step(
        name="optimizer-step",
        what="one optimizer step on R50-FPN's parameters",
        gpu_args=(
            "benchmarks/optimizer_step.py", "--device", "cuda", "--rounds", "50", "--warmup", "5",
            "--profile",
        ),
        dry_args=(
            "benchmarks/optimizer_step.py", "--device", "cpu", "--rounds", "1", "--warmup", "0",
            "--profile", *TINY_DETECTOR,
        ),
        timeout_s=180,
        parse=parse_optimizer_step,
        summarize=summarize_optimizer_step,
        required=("step_ms", "profile"),
        required_on_gpu=("pmd_lamb_vs_fused_adamw",),
    ),
    _train_throughput_step("bfloat16", "bf16"),
    _train_throughput_step("float16", "fp16"),
    Step(
        name="video-throughput",
        what="TSM vs TSN vs I3D-R50 training clips/s, 8x224^2, batch 8",
        gpu_args=(
            "projects/video/benchmarks/throughput.py", "--device", "cuda", "--decode-seconds", "2",
        ),
        dry_args=(
            "projects/video/benchmarks/throughput.py", "--device", "cpu", "--depth", "50",
            "--width", "8", "--size", "32", "--frames", "4", "--batch", "2", "--steps", "1", "--rounds", "1",
            "--warmup", "0", "--skip-decode",
        ),
        timeout_s=420,
        parse=parse_video_throughput,
        summarize=summarize_video_throughput,
        required=("clips_per_s", "tsm_vs_i3d_3x3x3", "tsm_vs_i3d_3x1x1", "shift_cost_pct"),
    ),
    Step(
        name="multigrid",
        what="multigrid vs the base shape, the video demo on the GPU",
        gpu_args=(
            "projects/video/benchmarks/multigrid.py", "--epoch-factors", "1.5", "1.0",
            "--output", "{out}/multigrid", "MODEL.DEVICE", "cuda",
            "DATALOADER.NUM_WORKERS", "8", "DATASETS.MOVING_SHAPES.ROOT", "{out}/datasets",
        ),
        dry_args=(
            "projects/video/benchmarks/multigrid.py", "--epoch-factors", "1.5", "1.0",
            "--output", "{out}/multigrid", "MODEL.DEVICE", "cpu",
            "DATASETS.MOVING_SHAPES.ROOT", "{out}/datasets", *TINY_MULTIGRID,
        ),
        timeout_s=480,
        parse=parse_multigrid,
        summarize=summarize_multigrid,
        required=("runs", "speedup", "top1_diff"),
    ),
)  # fmt: skip
STEP_NAMES = tuple(step.name for step in STEPS)


# --- the environment ------------------------------------------------------------------

# Run by the children's Python with their PYTHONPATH; argv[1]: the modules that must be
# there (found, not imported: importing them all takes seconds; the steps import them).
_PROBE = r"""
import importlib.metadata, importlib.util, json, os, platform, sys
info = {"python": platform.python_version(), "executable": sys.executable, "missing": {}}
for module in json.loads(sys.argv[1]):
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        found, info["missing"][module] = False, f"{type(e).__name__}: {e}"
    if not found:
        info["missing"].setdefault(module, "not found")
import torch
gpu = torch.cuda.is_available()
info.update(
    torch=torch.__version__, cuda=torch.version.cuda, cuda_available=gpu,
    cudnn=torch.backends.cudnn.version() if gpu else None,
    device=torch.cuda.get_device_name() if gpu else (platform.processor() or platform.machine()),
    device_count=torch.cuda.device_count(), cpu_count=os.cpu_count(),
)
if gpu:
    props = torch.cuda.get_device_properties(0)
    info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
versions = {}
for dist in ("torchvision", "numpy", "timm", "sal-detectron2", "fvcore", "av", "pytest"):
    try:
        versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        versions[dist] = None
info["versions"] = versions
if "largedet" not in info["missing"] and "detectron2" not in info["missing"]:
    try:
        import detectron2, largedet
        info["detectron2"] = os.path.dirname(detectron2.__file__)
        info["compiled_detectron2_ops"] = largedet.HAS_COMPILED_D2_OPS
    except Exception as e:
        info["missing"]["largedet"] = f"{type(e).__name__}: {e}"
print("GPU_CHECK_PROBE " + json.dumps(info))
"""


def child_env(site: Optional[str], dry_run: bool) -> Dict[str, str]:
    """The environment of every step: the repository, projects/video and the private site
    folder (where one was installed) first on PYTHONPATH; unbuffered output; on a dry run
    no GPU visible."""
    env = dict(os.environ)
    paths = ([site] if site and os.path.isdir(site) else []) + [REPO, VIDEO_PROJECT]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def probe(env: Dict[str, str]) -> Dict[str, Any]:
    modules = BASE_MODULES + tuple(m for _, m in DEVICE_PACKAGES) + PROJECT_MODULES
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(modules)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("GPU_CHECK_PROBE "):
            return json.loads(line[len("GPU_CHECK_PROBE ") :])
    return {"error": (proc.stdout + proc.stderr)[-4000:]}


def _wheel_distribution(path: str) -> str:
    return os.path.basename(path).split("-")[0].lower().replace("_", "-")


def install_wheels(wheels: str, site: str, missing: Sequence[str]) -> Dict[str, str]:
    """Install into ``site`` the wheels in ``wheels`` of the DEVICE_PACKAGES whose module is
    in ``missing``, one at a time (one that does not fit this Python does not stop the
    others); returns wheel file -> "installed" or pip's error."""
    wanted = {dist for dist, module in DEVICE_PACKAGES if module in missing}
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    pip += ["--no-compile", "--upgrade", "--target", site]
    outcome = {}
    for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        dist = _wheel_distribution(wheel)
        if dist not in wanted:
            continue
        if dist == "sal-detectron2":  # a CPython 3.10 wheel of Python files
            cmd = pip + ["--only-binary=:all:", "--python-version", DETECTRON2_WHEEL_PYTHON, wheel]
        else:
            cmd = pip + [wheel]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        outcome[os.path.basename(wheel)] = (
            "installed" if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()[-500:]
        )
    # sal-detectron2's stray top-level `tools` would shadow the repository's
    shutil.rmtree(os.path.join(site, "tools"), ignore_errors=True)
    return outcome


def set_up(args: argparse.Namespace) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """The children's environment and what the probe found in it, after installing what
    is missing from the wheel folder."""
    env = child_env(args.site, args.dry_run)
    info = probe(env)
    missing = sorted(info.get("missing", {}))
    if missing and os.path.isdir(args.wheels):
        print(
            f"Not importable: {', '.join(missing)}; installing from {args.wheels} into {args.site}"
        )
        installed = install_wheels(args.wheels, args.site, missing)
        for wheel, result in installed.items():
            print(f"  {wheel}: {result}")
        env = child_env(args.site, args.dry_run)
        info = probe(env)
        info["installed_wheels"] = installed
    return env, info


def fetch_wheels(folder: str, python_version: str) -> None:
    """Put the wheels of DEVICE_PACKAGES (this machine's versions) for CPython
    ``python_version`` on x86-64 Linux into ``folder``; a pure-Python package published only
    as source is built into a wheel here."""
    os.makedirs(folder, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    for dist, _ in DEVICE_PACKAGES:
        if dist == "sal-detectron2":
            spec, python = f"{dist}=={DETECTRON2_VERSION}", DETECTRON2_WHEEL_PYTHON
        else:
            spec, python = f"{dist}=={importlib.metadata.version(dist)}", python_version
        download = pip + ["download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", folder]
        download += ["--python-version", python, "--implementation", "cp"]
        if dist != "sal-detectron2":
            download += [arg for p in platforms for arg in ("--platform", p)]
        if subprocess.run(download + [spec], capture_output=True).returncode == 0:
            print(f"{spec}: downloaded")
            continue
        subprocess.run(pip + ["wheel", "--quiet", "--no-deps", "-w", folder, spec], check=True)
        print(f"{spec}: built from its source (no wheel published)")
    size = sum(os.path.getsize(w) for w in glob.glob(os.path.join(folder, "*.whl")))
    print(f"{folder}: {size / 2**20:.1f} MiB of wheels")


# --- running the steps ----------------------------------------------------------------


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_command(
    cmd: List[str], env: Dict[str, str], log_path: str, timeout: float
) -> Tuple[int, bool]:
    """Run ``cmd`` from the repository root with its output in ``log_path``; returns (exit
    code, whether it was stopped at ``timeout``). The command runs in a process group of its
    own, so that a stop also ends the processes it started (loader workers, say)."""
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _stop(proc)
            return proc.returncode, True
        except KeyboardInterrupt:
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def status_of(returncode: int, timed_out: bool, budget_stop: bool, missing: List[str]) -> str:
    if timed_out:
        return "interrupted" if budget_stop else "timeout"
    if returncode != 0:
        return "failed"
    return "incomplete" if missing else "passed"


def run_step(
    step: Step, args: argparse.Namespace, env, info, timeout: float, budget_stop: bool
) -> Dict[str, Any]:
    out_arg = os.path.relpath(args.output, REPO) if _inside(args.output, REPO) else args.output
    cmd = [sys.executable] + step.args(args.dry_run, out_arg)
    log_name = f"{step.name}.log"
    started = now()
    start = time.perf_counter()
    returncode, timed_out = run_command(cmd, env, os.path.join(args.output, log_name), timeout)
    wall = time.perf_counter() - start
    with open(os.path.join(args.output, log_name), errors="replace") as f:
        output = f.read()
    record: Dict[str, Any] = {
        "what": step.what,
        "command": ["python"] + cmd[1:],
        "command_line": shlex.join(["python"] + cmd[1:]),
        "exit_code": returncode,
        "wall_s": round(wall, 1),
        "timeout_s": round(timeout),
        "log": log_name,
        "date": started,
        "device": info.get("device"),
        "torch": info.get("torch"),
        "cuda": info.get("cuda"),
        "dry_run": args.dry_run,
    }
    try:
        figures = step.parse(output, args.output)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        figures = {}
        record["parse_error"] = f"{type(e).__name__}: {e}"
    required = step.required + (() if args.dry_run else step.required_on_gpu)
    missing = [key for key in required if key not in figures]
    record["figures"] = figures
    if missing:
        record["missing_figures"] = missing
    record["status"] = status_of(returncode, timed_out, budget_stop, missing)
    return record


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), root]) == root


def load_results(path: str, dry_run: bool) -> Dict[str, Any]:
    if not os.path.isfile(path):
        return {"steps": {}}
    with open(path) as f:
        results = json.load(f)
    if results.get("dry_run") != dry_run:
        kind = "a dry run" if results.get("dry_run") else "a GPU run"
        raise SystemExit(f"{path} holds {kind}: choose another --output")
    return results


def write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def summary_markdown(results: Dict[str, Any]) -> str:
    info = results.get("environment", {})
    dry_run = results.get("dry_run")
    if dry_run:
        title = "GPU check, dry run on the CPU (tiny sizes: the figures are not measurements)"
    else:
        title = f"GPU check on {info.get('device')}"
    if info.get("compiled_detectron2_ops"):
        detectron2 = "Detectron2 with its compiled ops"
    else:
        detectron2 = "Detectron2 without its compiled `_C`"
    lines = [
        f"### {title}",
        "",
        f"{results.get('updated', '')[:10]}; torch {info.get('torch')} (CUDA {info.get('cuda')}, "
        f"cuDNN {info.get('cudnn')}, NCCL {info.get('nccl')}), Python {info.get('python')}, "
        f"{info.get('cpu_count')} CPU cores; {detectron2}; timm "
        f"{info.get('versions', {}).get('timm')}. Command: `python benchmarks/gpu_check.py"
        f"{' --dry-run' if dry_run else ''}`; every step's command and log are in results.json.",
        "",
        "| step | status | wall | figures |",
        "| --- | --- | ---: | --- |",
    ]
    for step in STEPS:
        record = results["steps"].get(step.name)
        if record is None:
            lines.append(f"| {step.name}: {step.what} | not run | | |")
            continue
        try:
            figures = step.summarize(record["figures"]) if record["figures"] else ""
        except (KeyError, TypeError, ValueError):
            figures = ", ".join(sorted(record["figures"]))
        status = record["status"]
        if status == "incomplete":
            status += f" (not found: {', '.join(record['missing_figures'])})"
        lines.append(
            f"| {step.name}: {step.what} | {status} | {record['wall_s']:.0f} s | "
            f"{figures.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def archive(output: str, path: str) -> None:
    """The results, summary and logs (the output folder's files, not its sub-folders) in a
    .tar.gz, under the output folder's name."""
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for name in sorted(os.listdir(output)):
            full = os.path.join(output, name)
            if os.path.isfile(full) and not name.endswith(".tmp"):
                tar.add(
                    full, arcname=os.path.join(os.path.basename(os.path.normpath(output)), name)
                )
    os.replace(tmp, path)


def print_tail(path: str, lines: int = 25) -> None:
    with open(path, errors="replace") as f:
        tail = f.read().splitlines()[-lines:]
    print("\n".join("    | " + line for line in tail))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--output",
        help="results folder (default: output/gpu_check, or output/gpu_check_dry with --dry-run)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="every step on tiny sizes, on the CPU"
    )
    parser.add_argument("--steps", help=f"comma-separated subset of: {','.join(STEP_NAMES)}")
    parser.add_argument("--force", action="store_true", help="run steps already recorded as passed")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for this invocation (no step starts after; one running is stopped)",
    )
    parser.add_argument(
        "--wheels",
        default=os.path.join(REPO, ".whl"),
        help="wheels for packages that do not import (default: .whl)",
    )
    parser.add_argument(
        "--site",
        default=os.path.join(tempfile.gettempdir(), "largedet_gpu_check_site"),
        help="where those wheels are installed",
    )
    parser.add_argument("--archive", help="write OUTPUT's files into this .tar.gz after every step")
    parser.add_argument("--list", action="store_true", help="print the steps and their commands")
    parser.add_argument(
        "--fetch-wheels",
        metavar="DIR",
        help="download the wheels a plain CUDA image lacks into DIR, then exit",
    )
    parser.add_argument(
        "--python-version", default="3.12", help="of the GPU machine, for --fetch-wheels"
    )
    args = parser.parse_args()
    start = time.monotonic()
    args.output = os.path.abspath(
        args.output
        or os.path.join(REPO, "output", "gpu_check_dry" if args.dry_run else "gpu_check")
    )

    if args.fetch_wheels:
        fetch_wheels(args.fetch_wheels, args.python_version)
        return 0
    selected = list(STEPS)
    if args.steps:
        names = [n.strip() for n in args.steps.split(",") if n.strip()]
        unknown = sorted(set(names) - set(STEP_NAMES))
        if unknown:
            parser.error(f"unknown steps {unknown}; the steps: {', '.join(STEP_NAMES)}")
        selected = [s for s in STEPS if s.name in names]
    if args.list:
        for step in selected:
            command = step.args(args.dry_run, os.path.relpath(args.output, REPO))
            print(f"{step.name} ({step.timeout_s} s): {step.what}")
            print(f"    python {shlex.join(command)}")
        return 0

    os.makedirs(args.output, exist_ok=True)
    results_path = os.path.join(args.output, "results.json")
    results = load_results(results_path, args.dry_run)
    env, info = set_up(args)
    results.update(
        suite="largedet GPU check", dry_run=args.dry_run, environment=info, updated=now()
    )
    write_json(results_path, results)
    missing = info.get("missing", {})
    if "error" in info or {"largedet", "detectron2"} & set(missing):
        print(f"The steps cannot run here: {json.dumps(info, indent=2)}", file=sys.stderr)
        return 2
    if missing:
        print(f"Not importable (the steps that need them will fail): {json.dumps(missing)}")
    if not args.dry_run and not info.get("cuda_available"):
        print("No CUDA device: run with --dry-run on a machine without a GPU", file=sys.stderr)
        return 2
    print(
        f"{info['device']}, torch {info['torch']} (CUDA {info['cuda']}), Python {info['python']}; "
        f"results in {args.output}"
    )

    deadline = start + args.budget if args.budget else None
    failed = 0
    for step in selected:
        previous = results["steps"].get(step.name)
        if previous and previous["status"] == "passed" and not args.force:
            print(f"[{step.name}] passed on {previous['date']}: skipped (--force runs it again)")
            continue
        timeout = step.timeout_s if not args.dry_run else DRY_RUN_TIMEOUT_S
        budget_stop = False
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < MIN_STEP_SECONDS:
                print(f"[{step.name}] not started: {left:.0f} s of the budget left")
                continue
            if left < timeout:
                timeout, budget_stop = left, True
        print(f"[{step.name}] {step.what} (limit {timeout:.0f} s) ...", flush=True)
        record = run_step(step, args, env, info, timeout, budget_stop)
        results["steps"][step.name] = record
        results["updated"] = now()
        write_json(results_path, results)
        with open(os.path.join(args.output, "summary.md"), "w") as f:
            f.write(summary_markdown(results))
        if args.archive:
            archive(args.output, args.archive)
        figures = json.dumps(record["figures"])
        print(f"[{step.name}] {record['status']} in {record['wall_s']:.0f} s; figures: {figures}")
        if record["status"] != "passed":
            failed += 1
            print(f"[{step.name}] last lines of {record['log']}:")
            print_tail(os.path.join(args.output, record["log"]))
    with open(os.path.join(args.output, "summary.md"), "w") as f:
        f.write(summary_markdown(results))
    if args.archive:
        archive(args.output, args.archive)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
