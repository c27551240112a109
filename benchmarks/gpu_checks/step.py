"""One step of the GPU check: its commands, time limit and how its output is read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

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


def numbers_found(output: str, patterns: Sequence[Tuple[str, str]]) -> Figures:
    """For each ``(key, pattern)`` whose regular expression is in ``output``: key -> its first
    group as a float."""
    figures: Figures = {}
    for key, pattern in patterns:
        found = re.search(pattern, output)
        if found:
            figures[key] = float(found[1])
    return figures
