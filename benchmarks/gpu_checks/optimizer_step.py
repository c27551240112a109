"""The ``optimizer-step`` step's output: ``benchmarks/optimizer_step.py``'s table, its
comparison with fused AdamW, its profile and first-step times."""

from __future__ import annotations

import re

from .step import Figures

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
