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

The package, bottom up:

- :mod:`.csv_reader`: the CSV files read in chunks, errors naming file, line and column;
- :mod:`.hierarchy`: :class:`ClassHierarchy`, ancestors and descendants as CSR tables;
- :mod:`.annotations`: :class:`OpenImagesAnnotations`, compact arrays (about 30 bytes a
  box) parsed once and cached as memory-mapped ``.npy`` files keyed on each input's
  path, size and modification time; :func:`load_openimages_ground_truth`, the one
  loader of a split's annotations, classes and hierarchy (dataset, evaluator, CLI);
- :mod:`.dataset`: :class:`OpenImagesDataset` (dataset dicts made on demand, never a
  list of millions of Python dicts) and the registration in Detectron2's catalogs.

:mod:`.fixture` writes a tiny generated dataset in the official layout for tests and
quick runs; it is not imported here (import it where it is used).
"""

from .annotations import (
    BOX_FLAG_COLUMNS,
    OpenImagesAnnotations,
    OpenImagesGroundTruth,
    default_cache_dir,
    load_openimages_annotations,
    load_openimages_ground_truth,
    parse_openimages_annotations,
)
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
from .dataset import (
    CHALLENGE500_CLASSES_CSV,
    CHALLENGE500_HIERARCHY_JSON,
    CLASS_DESCRIPTIONS_CSV,
    HIERARCHY_JSON,
    V6_SPLITS,
    OpenImagesDataset,
    OpenImagesSplitFiles,
    default_openimages_root,
    load_openimages_dataset,
    read_image_sizes,
    register_all_openimages,
    register_openimages,
)
from .hierarchy import ClassHierarchy, concat_ranges, load_hierarchy

__all__ = [
    "BOX_FLAG_COLUMNS",
    "CHALLENGE500_CLASSES_CSV",
    "CHALLENGE500_HIERARCHY_JSON",
    "CLASS_DESCRIPTIONS_CSV",
    "ChunkedCsvReader",
    "ClassHierarchy",
    "HIERARCHY_JSON",
    "OpenImagesAnnotations",
    "OpenImagesDataset",
    "OpenImagesFormatError",
    "OpenImagesGroundTruth",
    "OpenImagesSplitFiles",
    "V6_SPLITS",
    "check_box_coordinates",
    "concat_ranges",
    "default_cache_dir",
    "default_openimages_root",
    "load_hierarchy",
    "load_openimages_annotations",
    "load_openimages_dataset",
    "load_openimages_ground_truth",
    "parse_flags",
    "parse_floats",
    "parse_indices",
    "parse_openimages_annotations",
    "read_class_descriptions",
    "read_class_subset",
    "read_image_sizes",
    "register_all_openimages",
    "register_openimages",
]
