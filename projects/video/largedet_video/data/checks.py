"""The data keys of the video project, checked before launch against what this room
reads: :data:`DATA_RULES` (the decoders it has), the frame sampling, a decoder that can
decode here, the ``DATASETS.VIDEO_LISTS`` entries, the files behind the datasets a run uses
(Kinetics CSVs, list files) and their labels within ``MODEL.VIDEO.NUM_CLASSES``. Each error
is one :class:`~largedet.config.errors.ConfigError` line naming the key or file."""

from __future__ import annotations

import os

from detectron2.config import CfgNode
from largedet.config.errors import ConfigError
from largedet.config.keys import Rule, one_of

from .decoding import DECODERS, torchcodec_unavailable
from .lists import is_kinetics_csv, kinetics_class_names, video_list_labels
from .moving_shapes import default_datasets_root
from .sampling import FrameSampling

__all__ = [
    "DATA_RULES",
    "check_dataset_files",
    "check_decoder",
    "check_frame_sampling",
    "check_labels",
    "check_video_lists",
]

#: The video data keys whose values name what this room has (checked before launch with
#: the keys' own rules, :data:`largedet_video.config.VIDEO_KEYS`).
DATA_RULES = (Rule("INPUT.VIDEO.DECODER", *one_of(DECODERS)),)


def check_frame_sampling(cfg: CfgNode) -> None:
    """``INPUT.VIDEO.SAMPLING`` and ``DENSE_STRIDE`` make a :class:`FrameSampling`."""
    try:
        FrameSampling(cfg.INPUT.VIDEO.SAMPLING, cfg.INPUT.VIDEO.DENSE_STRIDE)
    except ValueError as e:
        raise ConfigError(f"INPUT.VIDEO.SAMPLING: {e}") from None


def check_decoder(cfg: CfgNode) -> None:
    """A torchcodec ``INPUT.VIDEO.DECODER`` can decode on this machine."""
    decoder = cfg.INPUT.VIDEO.DECODER
    if decoder.startswith("torchcodec"):
        reason = torchcodec_unavailable()
        if reason:
            raise ConfigError(f"INPUT.VIDEO.DECODER: {decoder!r}: {reason}")


def _dataset_files(cfg: CfgNode) -> dict:
    """Dataset name -> the files its registration (``register_video_datasets``) reads."""
    k_root = cfg.DATASETS.KINETICS.ROOT or os.path.join(default_datasets_root(), "kinetics400")
    train_csv = os.path.join(k_root, "annotations", "train.csv")
    files = {
        "kinetics400_train": [train_csv],
        "kinetics400_val": [os.path.join(k_root, "annotations", "validate.csv"), train_csv],
    }
    for name, list_file, _root in cfg.DATASETS.VIDEO_LISTS:
        files[name] = [list_file]
    return files


def check_dataset_files(cfg: CfgNode, splits) -> None:
    """The files behind each dataset of ``DATASETS.<split>`` for ``split`` in ``splits``
    ("TRAIN", "TEST") are present."""
    files = _dataset_files(cfg)
    for split in splits:
        for name in cfg.DATASETS[split]:
            for path in files.get(name, ()):
                if not os.path.isfile(path):
                    raise ConfigError(
                        f"{path}: file of dataset {name!r} (DATASETS.{split}) not found"
                    )


def check_video_lists(cfg: CfgNode) -> None:
    """Each ``DATASETS.VIDEO_LISTS`` entry is ``[name, list_file, root]`` with its list file
    present (registering one opens it to tell a Kinetics CSV from a list) and its ``root``, where
    given, a folder."""
    for i, entry in enumerate(cfg.DATASETS.VIDEO_LISTS):
        if (
            not isinstance(entry, (list, tuple))
            or len(entry) != 3
            or not all(isinstance(v, str) for v in entry)
            or not entry[0]
            or not entry[1]
        ):
            raise ConfigError(
                f"DATASETS.VIDEO_LISTS[{i}]: expected [name, list_file, root] (strings), "
                f"got {entry!r}"
            )
        name, list_file, root = entry
        if not os.path.isfile(list_file):
            what = "is a folder, not a list file" if os.path.isdir(list_file) else "not found"
            raise ConfigError(
                f"{list_file}: list file of dataset {name!r} (DATASETS.VIDEO_LISTS) {what}"
            )
        if root and not os.path.isdir(root):
            what = "is a file, not a folder" if os.path.exists(root) else "not found"
            raise ConfigError(f"{root}: video folder of dataset {name!r} (DATASETS.VIDEO_LISTS) {what}")


def check_labels(cfg: CfgNode, splits) -> None:
    """The labels of the ``DATASETS.VIDEO_LISTS`` datasets a run uses are in
    ``[0, MODEL.VIDEO.NUM_CLASSES)``: a ``path label`` list is read (text, before any video);
    a Kinetics CSV names at most that many classes."""
    num_classes = cfg.MODEL.VIDEO.NUM_CLASSES
    lists = {name: list_file for name, list_file, _root in cfg.DATASETS.VIDEO_LISTS}
    for split in splits:
        for name in cfg.DATASETS[split]:
            if name not in lists:
                continue
            list_file = lists[name]
            if is_kinetics_csv(list_file):
                found = len(kinetics_class_names(list_file))
                if found > num_classes:
                    raise ConfigError(
                        f"{list_file}: {found} classes, more than MODEL.VIDEO.NUM_CLASSES "
                        f"{num_classes} (dataset {name!r}, DATASETS.{split})"
                    )
                continue
            try:
                labels = video_list_labels(list_file)
            except ValueError as e:  # its message starts with the file and line
                raise ConfigError(str(e)) from None
            for lineno, label in labels:
                if not 0 <= label < num_classes:
                    raise ConfigError(
                        f"{list_file}:{lineno}: label {label} is outside [0, {num_classes}) "
                        f"(MODEL.VIDEO.NUM_CLASSES {num_classes}; dataset {name!r}, "
                        f"DATASETS.{split})"
                    )
