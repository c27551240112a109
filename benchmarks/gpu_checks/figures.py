"""The output of the steps whose scripts were written for the check: one
``GPU-CHECK-FIGURES {json}`` line, and a compact summary cell of its figures."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from .step import Figures

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
