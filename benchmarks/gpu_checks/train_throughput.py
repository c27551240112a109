"""The ``train-throughput-*`` steps' output: ``benchmarks/train_throughput.py``'s images/s,
ratios and profile."""

from __future__ import annotations

import re

from .step import Figures, numbers_found

# Detectron2's model-zoo training speed of faster_rcnn_R_50_FPN_1x: 0.210 s/iteration for
# 16 images on 8 V100s.
MODEL_ZOO_IMAGES_PER_S = 16 / 0.210 / 8


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
    figures.update(numbers_found(output, (
        ("pmdlamb_vs_sgd", r"PMD-LAMB / SGD \(K=1\): ([\d.]+) wall-clock"),
        ("k8_vs_k1", r"K=8 / K=1 \(PMD-LAMB\): ([\d.]+) wall-clock"),
        ("per_gpu_images_per_s", r"per GPU with AMP: ([\d.]+) images/s"),
    )))
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
