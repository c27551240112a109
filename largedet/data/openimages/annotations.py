"""The boxes and image-level labels of a split as compact arrays, parsed once and cached.

:func:`parse_openimages_annotations` turns the official CSV files into an
:class:`OpenImagesAnnotations` (about 30 bytes a box). :func:`load_openimages_annotations`
does the same through a cache: a folder of ``.npy`` files under ``cache_dir`` (default
:func:`default_cache_dir`) keyed on each input's path, size and modification time,
written once by :func:`largedet.data.locations.build_once` (one process of a machine
parses while the others wait for its cache) and mapped into memory on later starts
(``mmap_mode="r"``, shared by all processes of a machine).

:func:`load_openimages_ground_truth` is what the dataset, the evaluator and
:func:`largedet.evaluation.oid_files.evaluate_files` read: the annotations with the
classes and the hierarchy of a registered split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..locations import build_once, cache_root
from .csv_reader import (
    ChunkedCsvReader,
    OpenImagesFormatError,
    check_box_coordinates,
    parse_flags,
    parse_floats,
    parse_indices,
    read_class_descriptions,
    read_class_subset,
)
from .hierarchy import ClassHierarchy, load_hierarchy

__all__ = [
    "BOX_FLAG_COLUMNS",
    "OpenImagesAnnotations",
    "OpenImagesGroundTruth",
    "cache_key",
    "default_cache_dir",
    "load_openimages_annotations",
    "load_openimages_ground_truth",
    "parse_openimages_annotations",
    "through_cache",
]

logger = logging.getLogger(__name__)

# Bump when the cached arrays change meaning or layout: old caches are then ignored.
_CACHE_VERSION = 1

# Boolean attributes of a box, in the order of the columns of
# OpenImagesAnnotations.box_flags. Each is optional in a file (challenge files carry
# IsGroupOf only); an absent one is stored as -1 ("unknown").
BOX_FLAG_COLUMNS = ("IsOccluded", "IsTruncated", "IsGroupOf", "IsDepiction", "IsInside")
_GROUP_OF = BOX_FLAG_COLUMNS.index("IsGroupOf")
_BOX_COLUMNS = ("ImageID", "LabelName", "XMin", "XMax", "YMin", "YMax", "IsGroupOf")
_LABEL_COLUMNS = ("ImageID", "LabelName", "Confidence")


def default_cache_dir() -> str:
    """``$LARGEDET_CACHE/openimages``, or ``~/.cache/largedet/openimages``: parsed-file caches
    (:func:`largedet.data.locations.cache_root`)."""
    return os.path.join(cache_root(), "openimages")


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


# ------------------------------------------------------------------------------- cache


def cache_key(kind: str, files: Sequence[Optional[str]], extra: object = None) -> str:
    """``<kind>-<hash>``: the hash of ``kind``, the cache version, ``extra`` (JSON) and
    each file's absolute path, size and modification time (None for a missing input)."""
    signature = []
    for path in files:
        if path is None:
            signature.append(None)
        else:
            st = os.stat(path)
            signature.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    blob = json.dumps({"kind": kind, "version": _CACHE_VERSION, "files": signature, "extra": extra})
    return f"{kind}-{hashlib.sha1(blob.encode()).hexdigest()[:20]}"


def _is_cached(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "meta.json"))


def through_cache(
    cache_dir: str, key: str, build: Callable[[], Tuple[Dict[str, np.ndarray], dict]]
) -> Tuple[Mapping[str, np.ndarray], dict]:
    """``(arrays, meta)`` from the cache folder ``<cache_dir>/<key>``, built first by
    ``build()`` if missing. Arrays from the cache are memory-mapped read-only.

    The folder (one ``.npy`` file per array and ``meta.json``) is written by
    :func:`~largedet.data.locations.build_once`: one process builds while the others
    (ranks of one machine) wait and then read its result. Errors of ``build()``
    propagate; a cache folder that cannot be written costs a warning and a build on
    every call.
    """
    target = os.path.join(cache_dir, key)
    started, built = [], []

    def write(folder: str) -> None:
        started.append(True)
        arrays, meta = build()
        built.append((arrays, meta))
        for name, array in arrays.items():
            np.save(os.path.join(folder, name + ".npy"), np.ascontiguousarray(array))
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({**meta, "arrays": list(arrays)}, f)

    try:
        build_once(target, write, is_complete=_is_cached)
    except OSError as e:
        if built:
            logger.warning("Could not write the cache %s: %s", target, e)
            return built[0]
        if started:
            raise
        logger.warning("Cache folder %s is not usable (%s); working without a cache", cache_dir, e)
        return build()
    if built:
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

    arrays, meta = through_cache(
        cache_dir or default_cache_dir(), cache_key("annotations", files), build
    )
    return OpenImagesAnnotations(
        label_names=tuple(meta["label_names"]), display_names=tuple(meta["display_names"]), **arrays
    )


# ------------------------------------------------------------------------ ground truth


@dataclass(frozen=True)
class OpenImagesGroundTruth:
    """A split's annotations with the classes it is trained and evaluated on.

    ``class_indices[k]`` is the vocabulary index (into ``annotations.label_names``) of
    contiguous class id ``k``; ``hierarchy`` is the class hierarchy when one was read.
    The metric's view of some of its images is
    :meth:`largedet.evaluation.OIDGroundTruth.from_annotations`.
    """

    annotations: OpenImagesAnnotations
    class_indices: np.ndarray  # (C,) int64
    hierarchy: Optional[ClassHierarchy]


def load_openimages_ground_truth(
    boxes_csv: str,
    class_descriptions_csv: str,
    image_labels_csv: Optional[str] = None,
    hierarchy_json: Optional[str] = None,
    *,
    class_subset_csv: Optional[str] = None,
    cache_dir: Optional[str] = None,
    use_cache: bool = True,
) -> OpenImagesGroundTruth:
    """The ground truth of one split, as the dataset, the evaluator and ``evaluate_files`` read it.

    Args:
        boxes_csv, class_descriptions_csv, image_labels_csv: the annotation files (see
            :func:`parse_openimages_annotations`).
        hierarchy_json: read over the vocabulary when given; None leaves ``hierarchy`` None.
        class_subset_csv: a class-descriptions file naming the classes, in contiguous-id
            order (:func:`~largedet.data.openimages.csv_reader.read_class_subset`);
            default every class of the vocabulary.
        cache_dir: as in :func:`load_openimages_annotations`.
        use_cache: False parses the files without reading or writing a cache (a one-off
            evaluation).
    """
    if use_cache:
        ann = load_openimages_annotations(
            boxes_csv, class_descriptions_csv, image_labels_csv, cache_dir=cache_dir
        )
    else:
        ann = parse_openimages_annotations(boxes_csv, class_descriptions_csv, image_labels_csv)
    class_indices, _ = read_class_subset(ann.label_names, class_subset_csv)
    hierarchy = load_hierarchy(hierarchy_json, ann.label_names) if hierarchy_json else None
    return OpenImagesGroundTruth(ann, np.asarray(class_indices, dtype=np.int64), hierarchy)
