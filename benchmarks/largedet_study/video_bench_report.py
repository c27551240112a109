"""The decoded-video cache's figures in projects/video/README.md, generated from
``projects/video/benchmarks/results/decoded_cache.csv`` (rows of
``python projects/video/benchmarks/decoded_cache.py --csv ...``); registered in
:data:`largedet_study.report.BLOCKS` as ``video-decoded-cache``."""

from __future__ import annotations

from typing import Callable, Dict

from .demo_report import _column, _dates, _groups

DECODED_CACHE_CSV = "projects/video/benchmarks/results/decoded_cache.csv"

__all__ = ["BLOCKS", "decoded_cache_table"]


def decoded_cache_table(path: str = DECODED_CACHE_CSV) -> str:
    """One line per machine class, torch and load: the fresh processes measured, and the ranges
    over them of ms per training clip without the cache, with it in its first pass and later,
    and the ratio uncached / cached-later."""
    groups = _groups(path, ("cpu", "cpu_family_model", "torch", "load", "videos"))
    lines = [
        "| CPU (family/model) | torch | beside | videos | processes | uncached ms/clip "
        "| cached, first pass | cached, later passes | uncached / cached | dates |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (cpu, fm, torch_version, load, videos), runs in groups.items():
        lines.append(
            f"| {cpu} ({fm}) | {torch_version} | {load or 'nothing'} | {videos} | {len(runs)} "
            f"| {_column(runs, 'uncached_ms', '.2f')} | {_column(runs, 'cached_first_ms', '.2f')} "
            f"| {_column(runs, 'cached_ms', '.3f')} | {_column(runs, 'ratio', '.1f')}x | {_dates(runs)} |"
        )
    return "\n".join(lines)


BLOCKS: Dict[str, Callable[[], str]] = {"video-decoded-cache": decoded_cache_table}
