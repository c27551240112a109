"""OpenImages (V4 to V7, boxable layout) read from the official files, for Detectron2.

Files, under their official names (see :data:`V6_SPLITS`):

- ``*-annotations-bbox.csv``: one box per row; columns by header name
  (``ImageID, Source, LabelName, Confidence, XMin, XMax, YMin, YMax, IsOccluded,
  IsTruncated, IsGroupOf, IsDepiction, IsInside``, extra columns such as the V6
  ``XClick*`` ones are ignored); coordinates normalised to [0, 1].
- ``class-descriptions-boxable.csv``: ``LabelName,DisplayName`` rows, no header;
  the row order defines the class indices (the "vocabulary").
- ``*-annotations-human-imagelabels-boxable.csv``: ``ImageID, Source, LabelName,
  Confidence``; Confidence 1 = verified present, 0 = verified absent.
- ``bbox_labels_600_hierarchy.json``: nested ``{"LabelName": ..., "Subcategory": [...]}``.
- an images folder holding ``<ImageID>.jpg``.

Full-size files (14.6M box rows for V6 train) are parsed once into compact numpy
arrays (:class:`OpenImagesAnnotations`: about 30 bytes a box) and cached as ``.npy``
files keyed on each input's path, size and modification time; later starts map the
cache into memory (``mmap_mode="r"``, shared by all processes of a machine). A file
lock makes one process parse while the others wait for its cache.

Detectron2 sees a dataset as an :class:`OpenImagesDataset`: a map-style dataset
whose items are standard dataset dicts made on demand (absolute ``XYXY_ABS`` boxes,
``category_id`` contiguous, ``is_group_of`` kept on every annotation), so no list of
millions of Python dicts is ever built.
"""

from __future__ import annotations

import csv
import fcntl
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch.utils.data as torchdata
from PIL import Image

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

logger = logging.getLogger(__name__)

__all__ = [
    "BOX_FLAG_COLUMNS",
    "ClassHierarchy",
    "OpenImagesAnnotations",
    "OpenImagesDataset",
    "OpenImagesFormatError",
    "V6_SPLITS",
    "concat_ranges",
    "default_cache_dir",
    "default_openimages_root",
    "load_hierarchy",
    "load_openimages_annotations",
    "load_openimages_dataset",
    "parse_openimages_annotations",
    "read_class_descriptions",
    "read_class_subset",
    "read_image_sizes",
    "register_all_openimages",
    "register_openimages",
]

# Bump when the cached arrays change meaning or layout: old caches are then ignored.
_CACHE_VERSION = 1

# Boolean attributes of a box, in the order of the columns of
# OpenImagesAnnotations.box_flags. Each is optional in a file (challenge files carry
# IsGroupOf only); an absent one is stored as -1 ("unknown").
BOX_FLAG_COLUMNS = ("IsOccluded", "IsTruncated", "IsGroupOf", "IsDepiction", "IsInside")
_GROUP_OF = BOX_FLAG_COLUMNS.index("IsGroupOf")
_BOX_COLUMNS = ("ImageID", "LabelName", "XMin", "XMax", "YMin", "YMax", "IsGroupOf")
_LABEL_COLUMNS = ("ImageID", "LabelName", "Confidence")
_FLAG_VALUES = {b"0": 0, b"1": 1, b"-1": -1}
_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class OpenImagesSplitFiles:
    """Official file names of one split, relative to the OpenImages root folder."""

    boxes_csv: str
    image_labels_csv: str
    images_dir: str
    # Drop images without any box of the registered classes (training splits).
    filter_empty: bool


# The V6 layout (boxes and image-level labels of V5 for validation/test; the
# boxable image-level labels of train are unchanged since V5).
V6_SPLITS: Dict[str, OpenImagesSplitFiles] = {
    "train": OpenImagesSplitFiles(
        "oidv6-train-annotations-bbox.csv",
        "train-annotations-human-imagelabels-boxable.csv",
        "train",
        True,
    ),
    "val": OpenImagesSplitFiles(
        "validation-annotations-bbox.csv",
        "validation-annotations-human-imagelabels-boxable.csv",
        "validation",
        False,
    ),
    "test": OpenImagesSplitFiles(
        "test-annotations-bbox.csv",
        "test-annotations-human-imagelabels-boxable.csv",
        "test",
        False,
    ),
}
CLASS_DESCRIPTIONS_CSV = "class-descriptions-boxable.csv"
HIERARCHY_JSON = "bbox_labels_600_hierarchy.json"
# The Open Images Challenge 2019 class subset (500 of the 600 boxable classes).
CHALLENGE500_CLASSES_CSV = "challenge-2019-classes-description-500.csv"
CHALLENGE500_HIERARCHY_JSON = "challenge-2019-label500-hierarchy.json"


class OpenImagesFormatError(ValueError):
    """A file that does not follow the OpenImages format.

    The message names the file, and where known the line (1-based, the header
    being line 1) and the column.
    """

    def __init__(self, path: str, line: Optional[int], column: Optional[str], problem: str):
        self.path, self.line, self.column, self.problem = str(path), line, column, problem
        where = self.path
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {problem}")


# ----------------------------------------------------------------------------- paths


def default_openimages_root() -> str:
    """``$LARGEDET_DATASETS/openimages``, or ``~/.cache/largedet/datasets/openimages``."""
    base = os.environ.get("LARGEDET_DATASETS") or os.path.join(
        "~", ".cache", "largedet", "datasets"
    )
    return os.path.join(os.path.expanduser(base), "openimages")


def default_cache_dir() -> str:
    """``$LARGEDET_CACHE/openimages``, or ``~/.cache/largedet/openimages``: parsed-file caches."""
    base = os.environ.get("LARGEDET_CACHE") or os.path.join("~", ".cache", "largedet")
    return os.path.join(os.path.expanduser(base), "openimages")


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


# ------------------------------------------------------------------------- CSV reading


class ChunkedCsvReader:
    """Reads the named columns of a headed CSV file, in chunks of whole lines.

    Each chunk is ``(line_numbers, {column: list of bytes values})``. Lines without
    quotes are split with ``bytes.split`` (a few times faster than the csv module,
    which matters for 14M rows); a chunk holding quotes or a malformed line goes
    through the csv module, which also locates the bad line. Blank lines are skipped.
    """

    def __init__(self, path: str, required: Sequence[str], optional: Sequence[str] = ()):
        self.path = str(path)
        self._file = open(self.path, "rb")
        try:
            header_line = self._file.readline()
            header = [h.strip() for h in next(csv.reader([header_line.decode("utf-8-sig")]), [])]
            if not any(header):
                raise OpenImagesFormatError(
                    self.path, 1, None, "empty file: expected a header line"
                )
            missing = [c for c in required if c not in header]
            if missing:
                raise OpenImagesFormatError(
                    self.path,
                    1,
                    missing[0],
                    f"missing column(s) {', '.join(missing)}; the header has {', '.join(header)}",
                )
        except BaseException:
            self._file.close()
            raise
        self.columns = {c: header.index(c) for c in (*required, *optional) if c in header}
        self._num_fields = len(header)
        self._next_line = 2

    def __enter__(self) -> "ChunkedCsvReader":
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[Tuple[np.ndarray, Dict[str, list]]]:
        while True:
            lines = self._file.readlines(_CHUNK_BYTES)
            if not lines:
                return
            first = self._next_line
            self._next_line += len(lines)
            chunk = self._split_fast(lines, first)
            yield chunk if chunk is not None else self._split_csv(lines, first)

    def _split_fast(self, lines: List[bytes], first: int):
        data = b"".join(lines)
        if b'"' in data:
            return None
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        if not data.endswith(b"\n"):
            data += b"\n"
        buf = np.frombuffer(data, dtype=np.uint8)
        line_ends = np.flatnonzero(buf == ord("\n"))
        commas = np.searchsorted(np.flatnonzero(buf == ord(",")), line_ends)
        if len(line_ends) != len(lines) or not np.all(
            np.diff(commas, prepend=0) == self._num_fields - 1
        ):
            return None
        n, k = len(lines), self._num_fields
        fields = data.replace(b"\n", b",").split(b",")
        cols = {name: fields[pos : n * k : k] for name, pos in self.columns.items()}
        return np.arange(first, first + n), cols

    def _split_csv(self, lines: List[bytes], first: int):
        numbers, rows = [], []
        try:
            text = io.StringIO(b"".join(lines).decode("utf-8"), newline="")
        except UnicodeDecodeError as e:
            raise OpenImagesFormatError(
                self.path,
                None,
                None,
                f"not UTF-8 text (lines {first} to {first + len(lines) - 1}): {e}",
            ) from None
        reader = csv.reader(text)
        for row in reader:
            if any(field.strip() for field in row):
                line = first + reader.line_num - 1
                if len(row) != self._num_fields:
                    raise OpenImagesFormatError(
                        self.path,
                        line,
                        None,
                        f"expected {self._num_fields} fields (as in the header), found {len(row)}",
                    )
                numbers.append(line)
                rows.append(row)
        cols = {
            name: [row[pos].encode("utf-8") for row in rows] for name, pos in self.columns.items()
        }
        return np.asarray(numbers, dtype=np.int64), cols


def parse_floats(values: list, path: str, lines: np.ndarray, column: str) -> np.ndarray:
    """Values as float64; an error names the first one that is not a finite number."""
    try:
        out = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
        if np.isfinite(out).all():
            return out
    except ValueError:
        pass
    for i, v in enumerate(values):
        try:
            ok = np.isfinite(float(v))
        except ValueError:
            ok = False
        if not ok:
            raise OpenImagesFormatError(
                path, int(lines[i]), column, f"expected a number, found {v.decode()!r}"
            )
    raise AssertionError("unreachable")


def parse_indices(
    values: list,
    table: Mapping[bytes, int],
    path: str,
    lines: np.ndarray,
    column: str,
    problem: str,
) -> np.ndarray:
    """Values looked up in ``table`` (int32, values >= 0); the error for the first
    unknown value says ``problem.format(value=...)``."""
    out = np.fromiter(map(table.get, values, repeat(-1)), dtype=np.int32, count=len(values))
    bad = np.flatnonzero(out < 0)
    if bad.size:
        i = int(bad[0])
        raise OpenImagesFormatError(
            path, int(lines[i]), column, problem.format(value=values[i].decode())
        )
    return out


def parse_flags(values: list, path: str, lines: np.ndarray, column: str) -> np.ndarray:
    """0/1/-1 flags as int8; an error names the first other value."""
    joined = b"".join(values)
    if len(joined) == len(values):  # all one character: decode as bytes
        out = np.frombuffer(joined, dtype=np.uint8).astype(np.int8) - ord("0")
        if np.all((out == 0) | (out == 1)):
            return out
    out = np.fromiter(map(_FLAG_VALUES.get, values, repeat(2)), dtype=np.int8, count=len(values))
    bad = np.flatnonzero(out == 2)
    if bad.size:
        i = int(bad[0])
        raise OpenImagesFormatError(
            path, int(lines[i]), column, f"expected 0, 1 or -1, found {values[i].decode()!r}"
        )
    return out


def _intern_image_ids(
    values: list, table: Dict[bytes, int], path: str, lines: np.ndarray
) -> np.ndarray:
    """Index of each ImageID in ``table``, adding new ones in order of first appearance.

    Official files list an image's rows together, so only the first of each run of
    equal IDs is looked up.
    """
    if not values:
        return np.zeros(0, dtype=np.int64)
    ids = np.array(values, dtype="S")
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    heads = [values[i] for i in starts.tolist()]
    if b"" in heads:
        i = values.index(b"")
        raise OpenImagesFormatError(path, int(lines[i]), "ImageID", "empty ImageID")
    head_index = np.fromiter(
        (table.setdefault(v, len(table)) for v in heads), dtype=np.int64, count=len(heads)
    )
    return np.repeat(head_index, np.diff(np.append(starts, len(values))))


def check_box_coordinates(xmin, xmax, ymin, ymax, path: str, lines: np.ndarray) -> None:
    """Every coordinate in [0, 1], XMin <= XMax and YMin <= YMax, else an error naming the row."""
    for name, v in (("XMin", xmin), ("XMax", xmax), ("YMin", ymin), ("YMax", ymax)):
        bad = np.flatnonzero((v < 0) | (v > 1))
        if bad.size:
            i = int(bad[0])
            raise OpenImagesFormatError(
                path, int(lines[i]), name, f"{name} = {v[i]:g} is outside [0, 1]"
            )
    for lo_name, lo, hi_name, hi in (("XMin", xmin, "XMax", xmax), ("YMin", ymin, "YMax", ymax)):
        bad = np.flatnonzero(lo > hi)
        if bad.size:
            i = int(bad[0])
            raise OpenImagesFormatError(
                path,
                int(lines[i]),
                lo_name,
                f"{lo_name} = {lo[i]:g} is greater than {hi_name} = {hi[i]:g}",
            )


def read_class_descriptions(path: str) -> Tuple[List[str], List[str]]:
    """Read ``LabelName,DisplayName`` rows (no header; a ``LabelName,DisplayName``
    header line is skipped if present).

    Returns:
        (label_names, display_names), in file order: the class index of a label is
        its row index.
    """
    label_names: List[str] = []
    display_names: List[str] = []
    seen: Dict[str, int] = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        for row in reader:
            line = reader.line_num
            if not any(field.strip() for field in row):
                continue
            if [c.strip() for c in row] == ["LabelName", "DisplayName"] and not label_names:
                continue
            if len(row) != 2:
                raise OpenImagesFormatError(
                    path, line, None, f"expected 2 fields (LabelName,DisplayName), found {len(row)}"
                )
            label = row[0].strip()
            if not label:
                raise OpenImagesFormatError(path, line, "LabelName", "empty LabelName")
            if label in seen:
                raise OpenImagesFormatError(
                    path, line, "LabelName", f"{label!r} already defined on line {seen[label]}"
                )
            seen[label] = line
            label_names.append(label)
            display_names.append(row[1].strip())
    if not label_names:
        raise OpenImagesFormatError(path, None, None, "no classes")
    return label_names, display_names


# --------------------------------------------------------------------------- hierarchy


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


# ------------------------------------------------------------------------- annotations


@dataclass(frozen=True)
class OpenImagesAnnotations:
    """Boxes and image-level labels of one split, as compact arrays.

    Images (the union of those in the boxes and the image-level labels files) are
    sorted by ImageID; image ``i`` owns boxes ``box_offsets[i]:box_offsets[i + 1]``
    (in file order) and image-level labels ``label_offsets[i]:label_offsets[i + 1]``.
    Class indices refer to ``label_names`` (the class-descriptions file's rows).
    """

    label_names: Tuple[str, ...]
    display_names: Tuple[str, ...]
    image_ids: np.ndarray  # (I,) bytes ("S"), sorted, unique
    box_offsets: np.ndarray  # (I + 1,) int64
    boxes: np.ndarray  # (N, 4) float32: XMin, YMin, XMax, YMax in [0, 1]
    box_labels: np.ndarray  # (N,) int32 class index
    box_flags: np.ndarray  # (N, 5) int8, columns BOX_FLAG_COLUMNS; 1 yes, 0 no, -1 unknown
    label_offsets: np.ndarray  # (I + 1,) int64
    label_classes: np.ndarray  # (M,) int32 class index
    label_confidence: np.ndarray  # (M,) int8: 1 verified present, 0 verified absent

    _ARRAYS = (
        "image_ids",
        "box_offsets",
        "boxes",
        "box_labels",
        "box_flags",
        "label_offsets",
        "label_classes",
        "label_confidence",
    )

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    @property
    def box_is_group_of(self) -> np.ndarray:
        """(N,) bool: IsGroupOf of every box."""
        return self.box_flags[:, _GROUP_OF] == 1

    def box_images(self) -> np.ndarray:
        """(N,) int64: the image index of every box."""
        return np.repeat(np.arange(self.num_images, dtype=np.int64), np.diff(self.box_offsets))

    def label_images(self) -> np.ndarray:
        """(M,) int64: the image index of every image-level label."""
        return np.repeat(np.arange(self.num_images, dtype=np.int64), np.diff(self.label_offsets))

    def image_index(self, image_ids: Sequence) -> np.ndarray:
        """Index of each ImageID (str or bytes), -1 where unknown."""
        ids = np.asarray([i.encode() if isinstance(i, str) else i for i in image_ids], dtype="S")
        if len(self.image_ids) == 0 or len(ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.image_ids, ids), len(self.image_ids) - 1)
        return np.where(self.image_ids[pos] == ids, pos, -1).astype(np.int64)


def _group_by_image(image_rank: np.ndarray, num_images: int, *arrays: np.ndarray):
    order = np.argsort(image_rank, kind="stable")
    offsets = np.zeros(num_images + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(image_rank, minlength=num_images))
    return (offsets, *(a[order] for a in arrays))


def _concat(parts: List[np.ndarray], dtype, shape_tail=()) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros((0, *shape_tail), dtype=dtype)


def parse_openimages_annotations(
    boxes_csv: str,
    class_descriptions_csv: str,
    image_labels_csv: Optional[str] = None,
) -> OpenImagesAnnotations:
    """Parse the official files (no cache; see :func:`load_openimages_annotations`).

    Raises:
        OpenImagesFormatError: naming the file, line and column of the first bad
            value: a missing column, a field count that differs from the header, a
            LabelName not in the class descriptions, a coordinate outside [0, 1],
            XMin > XMax or YMin > YMax, a flag not in {0, 1, -1}, an image-level
            Confidence not in {0, 1}.
    """
    label_names, display_names = read_class_descriptions(class_descriptions_csv)
    label_table = {name.encode(): k for k, name in enumerate(label_names)}
    images: Dict[bytes, int] = {}
    unknown = f"unknown LabelName {{value!r}}: not in {class_descriptions_csv}"

    box_img, boxes, box_lab, flags = [], [], [], []
    with ChunkedCsvReader(boxes_csv, _BOX_COLUMNS, BOX_FLAG_COLUMNS) as reader:
        for lines, cols in reader:
            box_img.append(_intern_image_ids(cols["ImageID"], images, reader.path, lines))
            box_lab.append(
                parse_indices(
                    cols["LabelName"], label_table, reader.path, lines, "LabelName", unknown
                )
            )
            xmin, xmax, ymin, ymax = (
                parse_floats(cols[c], reader.path, lines, c)
                for c in ("XMin", "XMax", "YMin", "YMax")
            )
            check_box_coordinates(xmin, xmax, ymin, ymax, reader.path, lines)
            boxes.append(np.stack([xmin, ymin, xmax, ymax], axis=1).astype(np.float32))
            chunk_flags = np.full((len(lines), len(BOX_FLAG_COLUMNS)), -1, dtype=np.int8)
            for j, name in enumerate(BOX_FLAG_COLUMNS):
                if name in cols:
                    chunk_flags[:, j] = parse_flags(cols[name], reader.path, lines, name)
            flags.append(chunk_flags)
    num_boxes = sum(len(b) for b in boxes)

    lab_img, lab_cls, lab_conf = [], [], []
    if image_labels_csv is not None:
        with ChunkedCsvReader(image_labels_csv, _LABEL_COLUMNS) as reader:
            for lines, cols in reader:
                lab_img.append(_intern_image_ids(cols["ImageID"], images, reader.path, lines))
                lab_cls.append(
                    parse_indices(
                        cols["LabelName"], label_table, reader.path, lines, "LabelName", unknown
                    )
                )
                conf = parse_floats(cols["Confidence"], reader.path, lines, "Confidence")
                bad = np.flatnonzero((conf != 0) & (conf != 1))
                if bad.size:
                    raise OpenImagesFormatError(
                        reader.path,
                        int(lines[bad[0]]),
                        "Confidence",
                        f"expected 0 (verified absent) or 1 (verified present), found {conf[bad[0]]:g}",
                    )
                lab_conf.append(conf.astype(np.int8))

    ids = np.array(list(images), dtype="S") if images else np.zeros(0, dtype="S16")
    order = np.argsort(ids, kind="stable")
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids))
    box_offsets, boxes_a, box_lab_a, flags_a = _group_by_image(
        rank[_concat(box_img, np.int64)],
        len(ids),
        _concat(boxes, np.float32, (4,)),
        _concat(box_lab, np.int32),
        _concat(flags, np.int8, (len(BOX_FLAG_COLUMNS),)),
    )
    label_offsets, lab_cls_a, lab_conf_a = _group_by_image(
        rank[_concat(lab_img, np.int64)],
        len(ids),
        _concat(lab_cls, np.int32),
        _concat(lab_conf, np.int8),
    )
    logger.info(
        "Parsed %s: %d boxes, %d image-level labels, %d images, %d classes",
        boxes_csv,
        num_boxes,
        len(lab_cls_a),
        len(ids),
        len(label_names),
    )
    return OpenImagesAnnotations(
        label_names=tuple(label_names),
        display_names=tuple(display_names),
        image_ids=ids[order],
        box_offsets=box_offsets,
        boxes=boxes_a,
        box_labels=box_lab_a,
        box_flags=flags_a,
        label_offsets=label_offsets,
        label_classes=lab_cls_a,
        label_confidence=lab_conf_a,
    )


def _cache_key(kind: str, files: Sequence[Optional[str]], extra: object = None) -> str:
    signature = []
    for path in files:
        if path is None:
            signature.append(None)
        else:
            st = os.stat(path)
            signature.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    blob = json.dumps({"kind": kind, "version": _CACHE_VERSION, "files": signature, "extra": extra})
    return f"{kind}-{hashlib.sha1(blob.encode()).hexdigest()[:20]}"


def _write_cache_dir(target: str, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
    """Write ``.npy`` files and ``meta.json`` to a fresh folder, then rename it to ``target``."""
    tmp = tempfile.mkdtemp(prefix=os.path.basename(target) + ".tmp-", dir=os.path.dirname(target))
    try:
        for name, array in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(array))
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({**meta, "arrays": list(arrays)}, f)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _through_cache(
    cache_dir: str, key: str, build: Callable[[], Tuple[Dict[str, np.ndarray], dict]]
) -> Tuple[Mapping[str, np.ndarray], dict]:
    """``(arrays, meta)`` from the cache folder ``<cache_dir>/<key>``, built first by
    ``build()`` if missing. Arrays from the cache are memory-mapped read-only.

    An exclusive lock on ``<key>.lock`` makes one process build while the others
    (ranks of one machine) wait and then read its result. An unusable cache folder
    costs a warning and a build on every call.
    """
    target = os.path.join(cache_dir, key)
    try:
        os.makedirs(cache_dir, exist_ok=True)
        lock = open(target + ".lock", "a")
    except OSError as e:
        logger.warning("Cache folder %s is not usable (%s); working without a cache", cache_dir, e)
        return build()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(target):
            arrays, meta = build()
            try:
                _write_cache_dir(target, arrays, meta)
            except OSError as e:
                logger.warning("Could not write the cache %s: %s", target, e)
                return arrays, meta
            logger.info("Cached in %s", target)
    with open(os.path.join(target, "meta.json")) as f:
        meta = json.load(f)
    arrays = {n: np.load(os.path.join(target, n + ".npy"), mmap_mode="r") for n in meta["arrays"]}
    return arrays, meta


def load_openimages_annotations(
    boxes_csv: str,
    class_descriptions_csv: str,
    image_labels_csv: Optional[str] = None,
    *,
    cache_dir: Optional[str] = None,
) -> OpenImagesAnnotations:
    """:func:`parse_openimages_annotations`, through a cache.

    The cache is a folder of ``.npy`` files under ``cache_dir`` (default
    :func:`default_cache_dir`), keyed on the absolute path, size and modification
    time of the three input files; its arrays come back memory-mapped read-only, so
    the processes of one machine share one copy.
    """
    files = [boxes_csv, class_descriptions_csv, image_labels_csv]
    for path in files:
        if path is not None and not os.path.isfile(path):
            raise FileNotFoundError(f"OpenImages file not found: {path}")

    def build():
        ann = parse_openimages_annotations(boxes_csv, class_descriptions_csv, image_labels_csv)
        arrays = {n: getattr(ann, n) for n in OpenImagesAnnotations._ARRAYS}
        return arrays, {"label_names": ann.label_names, "display_names": ann.display_names}

    arrays, meta = _through_cache(
        cache_dir or default_cache_dir(), _cache_key("annotations", files), build
    )
    return OpenImagesAnnotations(
        label_names=tuple(meta["label_names"]), display_names=tuple(meta["display_names"]), **arrays
    )


# ------------------------------------------------------------------------ image sizes


def _image_size(path: str) -> Tuple[int, int]:
    # (height, width) as Detectron2's read_image returns the image: EXIF
    # orientations 5-8 are rotations by 90 degrees, which swap the two.
    with Image.open(path) as im:
        width, height = im.size
        if im.getexif().get(0x0112, 1) in (5, 6, 7, 8):
            width, height = height, width
    return height, width


def read_image_sizes(paths: Sequence[str], num_threads: int = 16) -> np.ndarray:
    """(height, width) of each image, from the file headers, after EXIF orientation.

    Returns:
        (len(paths), 2) int32. Raises FileNotFoundError naming a missing image.
    """
    sizes = np.zeros((len(paths), 2), dtype=np.int32)
    if not paths:
        return sizes
    with ThreadPoolExecutor(max_workers=max(1, num_threads)) as pool:
        for i, hw in enumerate(pool.map(_image_size, paths, chunksize=256)):
            sizes[i] = hw
    return sizes


def _cached_image_sizes(images_dir: str, image_ids: np.ndarray, cache_dir: str) -> np.ndarray:
    """:func:`read_image_sizes` of ``<images_dir>/<ImageID>.jpg``, cached on folder and IDs."""
    digest = hashlib.sha1(np.ascontiguousarray(image_ids).tobytes()).hexdigest()
    key = _cache_key("sizes", [], [os.path.abspath(images_dir), image_ids.dtype.str, digest])

    def build():
        logger.info(
            "Reading the sizes of %d images in %s (once, then cached)", len(image_ids), images_dir
        )
        paths = [os.path.join(images_dir, i.decode() + ".jpg") for i in image_ids]
        return {"sizes": read_image_sizes(paths)}, {}

    arrays, _ = _through_cache(cache_dir, key, build)
    return np.asarray(arrays["sizes"])


# ---------------------------------------------------------------------------- dataset


class OpenImagesDataset(torchdata.Dataset):
    """Detectron2 dataset dicts of one OpenImages split, made on demand.

    Item ``i`` is a standard dataset dict::

        {"file_name": "<images_dir>/<ImageID>.jpg", "image_id": "<ImageID>",
         "height": h, "width": w,
         "annotations": [{"bbox": [x0, y0, x1, y1], "bbox_mode": BoxMode.XYXY_ABS,
                          "category_id": k, "is_group_of": bool}, ...]}

    ``k`` is the contiguous id of the box's class in ``class_indices``; boxes of
    other classes are left out. With a ``hierarchy``, each box also appears once
    for each ancestor class that is in ``class_indices``.

    Args:
        annotations: the parsed split.
        images_dir: folder of ``<ImageID>.jpg``.
        image_indices: (L,) images of ``annotations`` that make up the dataset.
        image_sizes: (L, 2) int (height, width) of those images.
        class_indices: vocabulary index of each contiguous class id.
        hierarchy: expand boxes to ancestor classes when given.
    """

    def __init__(
        self,
        annotations: OpenImagesAnnotations,
        images_dir: str,
        image_indices: np.ndarray,
        image_sizes: np.ndarray,
        class_indices: Sequence[int],
        hierarchy: Optional[ClassHierarchy] = None,
    ):
        self.annotations = annotations
        self.images_dir = images_dir
        self.image_indices = np.asarray(image_indices, dtype=np.int64)
        self.image_sizes = np.asarray(image_sizes, dtype=np.int64)
        self._ptr, self._idx = _category_table(
            len(annotations.label_names), class_indices, hierarchy
        )

    def __len__(self) -> int:
        return len(self.image_indices)

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} images")
        ann = self.annotations
        k = int(self.image_indices[i])
        lo, hi = int(ann.box_offsets[k]), int(ann.box_offsets[k + 1])
        labels = np.asarray(ann.box_labels[lo:hi], dtype=np.int64)
        counts = self._ptr[labels + 1] - self._ptr[labels]
        rows = np.repeat(np.arange(hi - lo), counts)
        categories = self._idx[concat_ranges(self._ptr[labels], counts)]
        height, width = (int(v) for v in self.image_sizes[i])
        boxes = np.asarray(ann.boxes[lo:hi], dtype=np.float64)[rows] * (
            width,
            height,
            width,
            height,
        )
        group_of = np.asarray(ann.box_flags[lo:hi, _GROUP_OF])[rows] == 1
        image_id = ann.image_ids[k].decode()
        return {
            "file_name": os.path.join(self.images_dir, image_id + ".jpg"),
            "image_id": image_id,
            "height": height,
            "width": width,
            "annotations": [
                {"bbox": b, "bbox_mode": BoxMode.XYXY_ABS, "category_id": c, "is_group_of": g}
                for b, c, g in zip(boxes.tolist(), categories.tolist(), group_of.tolist())
            ],
        }

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self)))


def _category_table(
    num_labels: int, class_indices: Sequence[int], hierarchy: Optional[ClassHierarchy]
):
    """CSR table: vocabulary index -> contiguous ids its box is annotated as."""
    contiguous = np.full(num_labels, -1, dtype=np.int64)
    contiguous[np.asarray(class_indices, dtype=np.int64)] = np.arange(len(class_indices))
    if hierarchy is None:
        rows, related = np.arange(num_labels), np.arange(num_labels)
    else:
        rows, related = hierarchy.expand_up(np.arange(num_labels))
    keep = contiguous[related] >= 0
    ptr = np.zeros(num_labels + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(rows[keep], minlength=num_labels))
    return ptr, contiguous[related[keep]]


def read_class_subset(
    label_names: Sequence[str], class_subset_csv: Optional[str]
) -> Tuple[List[int], Optional[List[str]]]:
    """Vocabulary indices and display names of the classes of a class-descriptions
    file (e.g. the challenge's 500), in its order; ``(all indices, None)`` for None."""
    if class_subset_csv is None:
        return list(range(len(label_names))), None
    names, display = read_class_descriptions(class_subset_csv)
    index = {n: k for k, n in enumerate(label_names)}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise OpenImagesFormatError(
            class_subset_csv, None, "LabelName", f"{unknown[0]!r} is not in the class descriptions"
        )
    return [index[n] for n in names], display


def load_openimages_dataset(
    boxes_csv: str,
    images_dir: str,
    class_descriptions_csv: str,
    image_labels_csv: Optional[str] = None,
    hierarchy_json: Optional[str] = None,
    *,
    class_subset_csv: Optional[str] = None,
    expand_hierarchy: bool = False,
    filter_empty: bool = False,
    cache_dir: Optional[str] = None,
) -> OpenImagesDataset:
    """The :class:`OpenImagesDataset` of one split (see :func:`register_openimages`)."""
    cache_dir = cache_dir or default_cache_dir()
    ann = load_openimages_annotations(
        boxes_csv, class_descriptions_csv, image_labels_csv, cache_dir=cache_dir
    )
    class_indices, _ = read_class_subset(ann.label_names, class_subset_csv)
    hierarchy = None
    if expand_hierarchy:
        if hierarchy_json is None:
            raise ValueError("expand_hierarchy=True needs a hierarchy_json")
        hierarchy = load_hierarchy(hierarchy_json, ann.label_names)
    if filter_empty:
        ptr, _ = _category_table(len(ann.label_names), class_indices, hierarchy)
        labels = np.asarray(ann.box_labels, dtype=np.int64)
        per_image = np.bincount(
            ann.box_images(), weights=ptr[labels + 1] - ptr[labels], minlength=ann.num_images
        )
        image_indices = np.flatnonzero(per_image > 0)
    else:
        image_indices = np.arange(ann.num_images)
    sizes = _cached_image_sizes(images_dir, ann.image_ids[image_indices], cache_dir)
    logger.info(
        "OpenImages %s: %d images (%d with boxes before filtering), %d classes%s",
        boxes_csv,
        len(image_indices),
        int(np.count_nonzero(np.diff(ann.box_offsets))),
        len(class_indices),
        ", boxes expanded to ancestor classes" if hierarchy is not None else "",
    )
    return OpenImagesDataset(ann, images_dir, image_indices, sizes, class_indices, hierarchy)


def _load_and_describe(
    name: str, prepare: Optional[Callable[[], object]], **kwargs
) -> OpenImagesDataset:
    if prepare is not None:
        prepare()
    dataset = load_openimages_dataset(**kwargs)
    _set_class_metadata(
        name,
        dataset.annotations.label_names,
        dataset.annotations.display_names,
        kwargs.get("class_subset_csv"),
    )
    return dataset


def _set_class_metadata(
    name: str,
    label_names: Sequence[str],
    display_names: Sequence[str],
    class_subset_csv: Optional[str],
) -> None:
    meta = MetadataCatalog.get(name)
    if "thing_classes" in meta.as_dict():
        return
    indices, subset_display = read_class_subset(label_names, class_subset_csv)
    meta.set(
        thing_classes=(
            list(subset_display)
            if subset_display is not None
            else [display_names[k] for k in indices]
        ),
        label_names=[label_names[k] for k in indices],
    )


def register_openimages(
    name: str,
    boxes_csv: str,
    images_dir: str,
    class_descriptions_csv: str,
    image_labels_csv: Optional[str] = None,
    hierarchy_json: Optional[str] = None,
    *,
    class_subset_csv: Optional[str] = None,
    expand_hierarchy: bool = False,
    filter_empty: bool = False,
    cache_dir: Optional[str] = None,
    prepare: Optional[Callable[[], object]] = None,
) -> None:
    """Register one OpenImages split in Detectron2's catalogs (replacing ``name`` if taken).

    Nothing is parsed here: ``DatasetCatalog.get(name)`` returns the
    :class:`OpenImagesDataset` (parsed once, then cached).

    Args:
        boxes_csv: ``*-annotations-bbox.csv``.
        images_dir: folder of ``<ImageID>.jpg``.
        class_descriptions_csv: ``class-descriptions-boxable.csv`` (the vocabulary).
        image_labels_csv: ``*-annotations-human-imagelabels-boxable.csv``; needed by
            the evaluator (rule: detections of unverified classes are ignored).
        hierarchy_json: ``bbox_labels_600_hierarchy.json``; the evaluator expands the
            ground truth with it.
        class_subset_csv: a class-descriptions file naming the classes to train and
            evaluate, in contiguous-id order (e.g. the challenge's 500); default all.
        expand_hierarchy: training dicts also carry each box for every ancestor class.
        filter_empty: leave out images without a box of the registered classes.
        cache_dir: parsed-file caches (default :func:`default_cache_dir`).
        prepare: called before the files are read on each load (e.g. to generate them).

    Metadata: ``thing_classes`` (display names) and ``label_names`` (LabelNames)
    per contiguous id, set now if the class files exist, else on first load;
    ``evaluator_type="openimages"`` and the file paths, read by
    :class:`largedet.evaluation.OIDEvaluator`.
    """
    kwargs = dict(
        boxes_csv=boxes_csv,
        images_dir=images_dir,
        class_descriptions_csv=class_descriptions_csv,
        image_labels_csv=image_labels_csv,
        hierarchy_json=hierarchy_json,
        class_subset_csv=class_subset_csv,
        expand_hierarchy=expand_hierarchy,
        filter_empty=filter_empty,
        cache_dir=cache_dir,
    )
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
    if name in MetadataCatalog.list():
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, functools.partial(_load_and_describe, name, prepare, **kwargs))
    MetadataCatalog.get(name).set(
        evaluator_type="openimages",
        boxes_csv=boxes_csv,
        images_dir=images_dir,
        class_descriptions_csv=class_descriptions_csv,
        image_labels_csv=image_labels_csv,
        hierarchy_json=hierarchy_json,
        class_subset_csv=class_subset_csv,
        cache_dir=cache_dir,
    )
    if os.path.isfile(class_descriptions_csv) and (
        class_subset_csv is None or os.path.isfile(class_subset_csv)
    ):
        try:
            labels, display = read_class_descriptions(class_descriptions_csv)
            _set_class_metadata(name, labels, display, class_subset_csv)
        except OpenImagesFormatError as e:
            # Registration runs at import; the same error is raised when the dataset is loaded.
            logger.warning("Registered %s without class names: %s", name, e)


def register_all_openimages(
    root: Optional[str] = None,
    *,
    cache_dir: Optional[str] = None,
    expand_hierarchy: bool = False,
) -> List[str]:
    """Register the V6 splits found (or to be found) under ``root``, by official file names.

    Names: ``openimages_v6_{train,val,test}`` (every class of
    ``class-descriptions-boxable.csv``, 601 in V6) and
    ``openimages_v6_challenge500_{train,val,test}`` (the challenge's 500 classes of
    ``challenge-2019-classes-description-500.csv``, with its hierarchy). Train splits
    drop images without boxes. Paths are fixed now, files read on first use.

    Args:
        root: folder of the official files (default :func:`default_openimages_root`).
        cache_dir, expand_hierarchy: as in :func:`register_openimages`.

    Returns:
        The registered names.
    """
    root = root or default_openimages_root()
    names = []
    for split, files in V6_SPLITS.items():
        for suffix, subset, hierarchy in (
            ("", None, HIERARCHY_JSON),
            ("_challenge500", CHALLENGE500_CLASSES_CSV, CHALLENGE500_HIERARCHY_JSON),
        ):
            name = f"openimages_v6{suffix}_{split}"
            register_openimages(
                name,
                os.path.join(root, files.boxes_csv),
                os.path.join(root, files.images_dir),
                os.path.join(root, CLASS_DESCRIPTIONS_CSV),
                os.path.join(root, files.image_labels_csv),
                os.path.join(root, hierarchy),
                class_subset_csv=os.path.join(root, subset) if subset else None,
                expand_hierarchy=expand_hierarchy,
                filter_empty=files.filter_empty,
                cache_dir=cache_dir,
            )
            names.append(name)
    return names
