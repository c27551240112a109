"""The words of a study cell's name: what the cell changes from its grid's defaults, each as a
short tag (``ep2x``, ``wu3``, ``lrx0.5``, ``lrcosine``, ``s1``), joined by ``-`` after the
optimizer and the batch. The detection and the video cells name their runs with these."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

__all__ = ["cell_name", "choice_tag", "factor_tag", "value_tag"]


def factor_tag(prefix: str, factor: float, suffix: str = "") -> Optional[str]:
    """``{prefix}{factor:g}{suffix}`` for a factor other than 1, else None."""
    return None if factor == 1.0 else f"{prefix}{factor:g}{suffix}"


def value_tag(prefix: str, value: Optional[float]) -> Optional[str]:
    """``{prefix}{value:g}`` for a value that is set, else None (the grid's default)."""
    return None if value is None else f"{prefix}{value:g}"


def choice_tag(prefix: str, choice: str, default: str) -> Optional[str]:
    """``{prefix}{choice}`` for a choice other than ``default``, else None."""
    return None if choice == default else f"{prefix}{choice}"


def cell_name(head: Sequence[str], tags: Iterable[Optional[str]], seed: Optional[int]) -> str:
    """``head``, the ``tags`` that are not None, and ``s{seed}`` for a seed that is set,
    joined by ``-``."""
    parts = [*head, *(tag for tag in tags if tag is not None)]
    if seed is not None:
        parts.append(f"s{seed}")
    return "-".join(parts)
