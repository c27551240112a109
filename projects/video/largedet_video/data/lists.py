"""Video lists: ``path label`` files and the official Kinetics CSVs.

A dataset is a list of records (Detectron2's dataset-dict convention)::

    {"path": "/abs/video.mp4", "label": 3}                     # a video file
    {"path": "/abs/frames_dir", "label": 3, "num_frames": 300}  # JPEG frames

List-file lines are ``path label`` or ``path num_frames label`` (the TSN/TSM
frame-list form), separated by whitespace or by commas (use commas when paths
contain spaces); blank lines and lines starting with ``#`` are ignored. Labels
are class indices. Relative paths are joined to ``root``.

The official Kinetics CSV has the header ``label,youtube_id,time_start,time_end,split``
(the test split has no label column); clip files are named
``<youtube_id>_<time_start:06d>_<time_end:06d>.mp4``, stored either directly in
the video folder or in one sub-folder per class. Class indices are positions in
the sorted list of class names.
"""

from __future__ import annotations

import csv
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = [
    "load_video_list",
    "video_list_labels",
    "load_kinetics_csv",
    "kinetics_class_names",
    "kinetics_file_name",
    "is_kinetics_csv",
]

logger = logging.getLogger(__name__)

KINETICS_VIDEO_EXTS = (".mp4", ".webm", ".mkv", ".avi")


def _split_line(line: str) -> List[str]:
    if "," in line:
        return [tok.strip() for tok in line.split(",")]
    return line.split()


def _parse_record(list_file: str, lineno: int, line: str, root: str) -> Dict:
    toks = _split_line(line)
    if len(toks) not in (2, 3):
        raise ValueError(
            f"{list_file}:{lineno}: expected 'path label' or 'path num_frames label', "
            f"got {line!r}"
        )
    try:
        record = {"path": os.path.join(root, toks[0]), "label": int(toks[-1])}
        if len(toks) == 3:
            record["num_frames"] = int(toks[1])
    except ValueError as e:
        raise ValueError(f"{list_file}:{lineno}: {e}") from e
    return record


def load_video_list(list_file: str, root: str = "") -> List[Dict]:
    """Records from a ``path [num_frames] label`` list file (see module docstring)."""
    records = []
    with open(list_file) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            records.append(_parse_record(list_file, lineno, line, root))
    return records


def video_list_labels(list_file: str) -> List[Tuple[int, int]]:
    """``(line number, label)`` of each record of a ``path [num_frames] label`` list file,
    as :func:`load_video_list` reads them (ValueError naming the file and line)."""
    labels = []
    with open(list_file) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if line and not line.startswith("#"):
                labels.append((lineno, _parse_record(list_file, lineno, line, "")["label"]))
    return labels


def is_kinetics_csv(list_file: str) -> bool:
    with open(list_file) as f:
        header = f.readline().strip().split(",")
    return "youtube_id" in header and "time_start" in header


def kinetics_file_name(
    youtube_id: str, time_start: float, time_end: float, ext: str = ".mp4"
) -> str:
    return f"{youtube_id}_{int(float(time_start)):06d}_{int(float(time_end)):06d}{ext}"


def kinetics_class_names(csv_file: str) -> List[str]:
    """Sorted class names of a Kinetics CSV (the standard index order)."""
    with open(csv_file, newline="") as f:
        return sorted({row["label"] for row in csv.DictReader(f)})


def _find_clip(video_root: str, label: Optional[str], stem: str) -> Optional[str]:
    folders = [video_root]
    if label is not None:
        folders += [
            os.path.join(video_root, label),
            os.path.join(video_root, label.replace(" ", "_")),
        ]
    for folder in folders:
        for ext in KINETICS_VIDEO_EXTS:
            path = os.path.join(folder, stem + ext)
            if os.path.isfile(path):
                return path
    return None


def load_kinetics_csv(
    csv_file: str, video_root: str, class_names: Optional[Sequence[str]] = None
) -> Tuple[List[Dict], List[str]]:
    """Records and class names from an official Kinetics CSV.

    Args:
        csv_file: ``label,youtube_id,time_start,time_end,split[,...]``.
        video_root: folder of the clips (flat, or one sub-folder per class).
        class_names: the class order to use (e.g. the training CSV's, for the
            validation CSV); default: this file's sorted class names.

    Clips missing on disk (common for Kinetics) are left out; their number is
    logged. Rows without a label (the test split) get label -1.
    """
    with open(csv_file, newline="") as f:
        rows = list(csv.DictReader(f))
    if class_names is None:
        class_names = sorted({r["label"] for r in rows if r.get("label")})
    index = {name: i for i, name in enumerate(class_names)}
    records, missing = [], 0
    for r in rows:
        label = r.get("label") or None
        if label is not None and label not in index:
            raise ValueError(f"{csv_file}: class {label!r} is not among the {len(index)} classes")
        stem = kinetics_file_name(r["youtube_id"], r["time_start"], r["time_end"], ext="")
        path = _find_clip(video_root, label, stem)
        if path is None:
            missing += 1
            continue
        records.append({"path": path, "label": index[label] if label is not None else -1})
    if missing:
        logger.warning(
            "%s: %d of %d clips not found under %s; using the %d found",
            csv_file,
            missing,
            len(rows),
            video_root,
            len(records),
        )
    return records, list(class_names)
