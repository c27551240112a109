"""The OpenImages class hierarchy (``bbox_labels_600_hierarchy.json``) over a vocabulary.

:class:`ClassHierarchy` holds every class's ancestors and descendants as CSR tables, so
that the dataset (boxes copied to ancestor classes) and the metric (ground truth
expanded up, verified-negative labels down) expand whole label arrays at once with
:func:`concat_ranges`.
"""

from __future__ import annotations

import json
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .csv_reader import OpenImagesFormatError

__all__ = ["ClassHierarchy", "concat_ranges", "load_hierarchy"]


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[starts[0], ..., starts[0] + counts[0] - 1, starts[1], ...]`` as one int64 array."""
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(
        total, dtype=np.int64
    )


class ClassHierarchy:
    """Ancestors and descendants of every class of a vocabulary.

    Built from the official hierarchy JSON (``bbox_labels_600_hierarchy.json``): a
    node ``{"LabelName": L, "Subcategory": [children]}``; a class may appear under
    several parents. Only ``Subcategory`` edges count (``Part`` entries are not
    kinds of their parent). The root node (``/m/0bl9f``, "Entity") is nobody's
    ancestor. Nodes outside the vocabulary link their neighbours (the closure goes
    through them) but never appear in a result.

    Args:
        label_names: the vocabulary; class index k is ``label_names[k]``.
        parents: LabelName -> LabelNames of its direct parents.
    """

    def __init__(
        self,
        label_names: Sequence[str],
        parents: Mapping[str, Sequence[str]],
        *,
        source: str = "<hierarchy>",
    ):
        self.label_names = tuple(label_names)
        index = {name: k for k, name in enumerate(self.label_names)}
        memo: Dict[str, frozenset] = {}

        def all_ancestors(node: str, stack: Tuple[str, ...]) -> frozenset:
            if node in memo:
                return memo[node]
            if node in stack:
                raise OpenImagesFormatError(
                    source, None, None, f"cycle in the hierarchy: {' -> '.join(stack + (node,))}"
                )
            result = set()
            for p in parents.get(node, ()):
                result.add(p)
                result |= all_ancestors(p, stack + (node,))
            memo[node] = frozenset(result)
            return memo[node]

        ancestors = [
            sorted({index[a] for a in all_ancestors(name, ()) if a in index} - {k})
            for k, name in enumerate(self.label_names)
        ]
        descendants: List[List[int]] = [[] for _ in self.label_names]
        for k, anc in enumerate(ancestors):
            for a in anc:
                descendants[a].append(k)
        self._up = self._csr(ancestors)
        self._down = self._csr(descendants)

    @staticmethod
    def _csr(related: List[List[int]]) -> Tuple[np.ndarray, np.ndarray]:
        # Row k holds k itself first, then its relatives.
        rows = [[k, *sorted(r)] for k, r in enumerate(related)]
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(r) for r in rows])
        idx = np.fromiter((c for r in rows for c in r), dtype=np.int64, count=int(ptr[-1]))
        return ptr, idx

    @classmethod
    def from_json_tree(
        cls, tree: Mapping, label_names: Sequence[str], *, source: str = "<hierarchy>"
    ) -> "ClassHierarchy":
        """Build from the parsed JSON tree (its root is skipped as an ancestor)."""
        parents: Dict[str, set] = {}

        def walk(node, where: str, parent: Optional[str]) -> None:
            if not isinstance(node, Mapping) or not isinstance(node.get("LabelName"), str):
                raise OpenImagesFormatError(
                    source,
                    None,
                    None,
                    f"node at {where} is not an object with a string 'LabelName'",
                )
            name = node["LabelName"]
            if parent is not None:
                parents.setdefault(name, set()).add(parent)
            children = node.get("Subcategory", [])
            if not isinstance(children, list):
                raise OpenImagesFormatError(
                    source, None, None, f"'Subcategory' of {name!r} at {where} is not a list"
                )
            for i, child in enumerate(children):
                walk(child, f"{where}.Subcategory[{i}]", name)

        if not isinstance(tree, Mapping):
            raise OpenImagesFormatError(source, None, None, "the top level is not an object")
        walk(tree, "$", None)
        root = tree["LabelName"]
        return cls(label_names, {c: sorted(p - {root}) for c, p in parents.items()}, source=source)

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def ancestors(self, k: int) -> np.ndarray:
        """Class indices of every ancestor of class ``k`` (not ``k`` itself), ascending."""
        ptr, idx = self._up
        return idx[ptr[k] + 1 : ptr[k + 1]]

    def descendants(self, k: int) -> np.ndarray:
        """Class indices of every descendant of class ``k`` (not ``k`` itself), ascending."""
        ptr, idx = self._down
        return idx[ptr[k] + 1 : ptr[k + 1]]

    def expand_up(self, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Each label followed by its ancestors: ``(rows, labels)``, where ``rows[j]`` is
        the input position that output ``j`` copies (inputs in order, self first)."""
        return self._expand(self._up, labels)

    def expand_down(self, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Each label followed by its descendants, as :meth:`expand_up`."""
        return self._expand(self._down, labels)

    @staticmethod
    def _expand(
        csr: Tuple[np.ndarray, np.ndarray], labels: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray]:
        ptr, idx = csr
        labels = np.asarray(labels, dtype=np.int64)
        counts = ptr[labels + 1] - ptr[labels]
        rows = np.repeat(np.arange(len(labels), dtype=np.int64), counts)
        return rows, idx[concat_ranges(ptr[labels], counts)]


def load_hierarchy(path: str, label_names: Sequence[str]) -> ClassHierarchy:
    """Read a hierarchy JSON (``bbox_labels_600_hierarchy.json`` form) over ``label_names``."""
    with open(path, encoding="utf-8") as f:
        try:
            tree = json.load(f)
        except json.JSONDecodeError as e:
            raise OpenImagesFormatError(path, e.lineno, None, f"invalid JSON: {e.msg}") from None
    return ClassHierarchy.from_json_tree(tree, label_names, source=str(path))
