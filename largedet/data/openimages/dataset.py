"""OpenImages splits as Detectron2 datasets: :class:`OpenImagesDataset` and registration.

A registered split is an :class:`OpenImagesDataset`: a map-style dataset whose items
are standard dataset dicts made on demand from the compact annotation arrays
(absolute ``XYXY_ABS`` boxes, ``category_id`` contiguous, ``is_group_of`` kept on every
annotation), so no list of millions of Python dicts is ever built. Image sizes are
read once from the file headers and cached beside the annotations.

:func:`register_all_openimages` registers the V6 splits under the official file names
(:data:`V6_SPLITS`) of a root folder, by default :func:`default_openimages_root`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch.utils.data as torchdata
from PIL import Image

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

from ..locations import datasets_root
from .annotations import (
    BOX_FLAG_COLUMNS,
    OpenImagesAnnotations,
    cache_key,
    default_cache_dir,
    load_openimages_ground_truth,
    through_cache,
)
from .csv_reader import OpenImagesFormatError, read_class_descriptions, read_class_subset
from .hierarchy import ClassHierarchy, concat_ranges

__all__ = [
    "CHALLENGE500_CLASSES_CSV",
    "CHALLENGE500_HIERARCHY_JSON",
    "CLASS_DESCRIPTIONS_CSV",
    "HIERARCHY_JSON",
    "OpenImagesDataset",
    "OpenImagesSplitFiles",
    "V6_SPLITS",
    "default_openimages_root",
    "load_openimages_dataset",
    "read_image_sizes",
    "register_all_openimages",
    "register_openimages",
]

logger = logging.getLogger(__name__)

_GROUP_OF = BOX_FLAG_COLUMNS.index("IsGroupOf")

# ------------------------------------------------------------------------------ layout


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


def default_openimages_root() -> str:
    """``<datasets root>/openimages``: ``$LARGEDET_DATASETS/openimages``, or
    ``~/.cache/largedet/datasets/openimages`` (:func:`largedet.data.locations.datasets_root`)."""
    return os.path.join(datasets_root(), "openimages")


# ------------------------------------------------------------------------- image sizes


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
    key = cache_key("sizes", [], [os.path.abspath(images_dir), image_ids.dtype.str, digest])

    def build():
        logger.info(
            "Reading the sizes of %d images in %s (once, then cached)", len(image_ids), images_dir
        )
        paths = [os.path.join(images_dir, i.decode() + ".jpg") for i in image_ids]
        return {"sizes": read_image_sizes(paths)}, {}

    arrays, _ = through_cache(cache_dir, key, build)
    return np.asarray(arrays["sizes"])


# ----------------------------------------------------------------------------- dataset


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
    if expand_hierarchy and hierarchy_json is None:
        raise ValueError("expand_hierarchy=True needs a hierarchy_json")
    cache_dir = cache_dir or default_cache_dir()
    gt = load_openimages_ground_truth(
        boxes_csv,
        class_descriptions_csv,
        image_labels_csv,
        hierarchy_json if expand_hierarchy else None,
        class_subset_csv=class_subset_csv,
        cache_dir=cache_dir,
    )
    ann, class_indices, hierarchy = gt.annotations, gt.class_indices, gt.hierarchy
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
    :class:`largedet.evaluation.OIDEvaluator`; ``generated`` (a ``prepare`` was given: the
    files are written on first load, so the check before launch does not look for them).
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
        generated=prepare is not None,
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
