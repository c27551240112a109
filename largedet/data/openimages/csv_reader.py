"""Reading the OpenImages CSV files: columns by header name, errors naming file, line, column.

Full-size files (14.6M rows for the V6 train boxes) are read in chunks of whole lines
by :class:`ChunkedCsvReader`; the ``parse_*`` functions turn a chunk's columns into
numpy arrays and name the first bad value. :func:`read_class_descriptions` reads the
vocabulary (``class-descriptions-boxable.csv``), :func:`read_class_subset` a class
subset of it (the challenge's 500 classes).
"""

from __future__ import annotations

import csv
import io
from itertools import repeat
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "ChunkedCsvReader",
    "OpenImagesFormatError",
    "check_box_coordinates",
    "parse_flags",
    "parse_floats",
    "parse_indices",
    "read_class_descriptions",
    "read_class_subset",
]

_FLAG_VALUES = {b"0": 0, b"1": 1, b"-1": -1}
_CHUNK_BYTES = 16 << 20


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
