"""Warnings that largedet's dependencies raise while they are imported and that a user
cannot act on (Detectron2's modules call ``torch.jit.script``, which recent torch marks as
deprecated): filtered once, when ``largedet`` is imported, before it imports them. A
warning raised while training, or any other of a dependency's, is shown as before."""

from __future__ import annotations

import warnings

__all__ = ["DEPENDENCY_WARNINGS", "filter_dependency_warnings"]

#: (category, message regex) of each warning filtered: a dependency's, at import time
DEPENDENCY_WARNINGS = (
    (FutureWarning, r"`torch\.jit\.script` is deprecated"),
)


def filter_dependency_warnings() -> None:
    """Ignore :data:`DEPENDENCY_WARNINGS`; calling it again adds no second filter."""
    for category, message in DEPENDENCY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, append=False)
