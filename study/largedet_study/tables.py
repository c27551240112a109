"""Markdown tables from the benchmarks' CSVs, the pieces the generated docs blocks share
(:mod:`.demo_report`, :mod:`.video_bench_report`): rows grouped by columns, a column's range
over a group, the dates, and the table itself."""

from __future__ import annotations

import csv
import os
from typing import Callable, Dict, Iterable, List, Sequence

__all__ = ["ROOT", "column_span", "csv_groups", "csv_missing", "group_by", "markdown_table", "run_dates", "span"]

#: the repository, which the CSV paths are relative to
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def span(values: List[float], fmt: str) -> str:
    """``lo-hi`` of ``values`` in ``fmt``; one number where they are all equal."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def column_span(runs: List[dict], field: str, fmt: str) -> str:
    """The range of a numeric column over ``runs``."""
    return span([float(r[field]) for r in runs], fmt)


def run_dates(runs: List[dict]) -> str:
    """The ``date`` column's values among ``runs``, sorted, once each."""
    return ", ".join(sorted({r["date"] for r in runs}))


def group_by(rows: Iterable[dict], key: Callable[[dict], object]) -> Dict[object, List[dict]]:
    """``rows`` grouped by ``key(row)``, in the order the groups first appear."""
    out: Dict[object, List[dict]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def csv_groups(path: str, columns: Sequence[str]) -> Dict[tuple, List[dict]]:
    """The rows of the CSV at ``path`` (relative to the repository), grouped by the values of
    ``columns``, in the order the groups first appear."""
    with open(os.path.join(ROOT, path), newline="") as f:
        rows = list(csv.DictReader(f))
    return group_by(rows, lambda row: tuple(row[k] for k in columns))


def csv_missing(path: str) -> bool:
    """No CSV at ``path`` (relative to the repository) yet: its table says so."""
    return not os.path.exists(os.path.join(ROOT, path))


def markdown_table(titles: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the ``titles`` row, the alignment row (``align``: one letter a column,
    ``l`` left, ``r`` right, ``c`` centred) and one line for each of ``rows``."""
    if len(align) != len(titles):
        raise ValueError(f"{len(titles)} columns, {len(align)} alignments")

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    return "\n".join([line(titles), line([_ALIGN[a] for a in align]), *map(line, rows)])
