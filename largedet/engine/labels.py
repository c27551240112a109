"""What the picture tools (``tools/predict.py``, ``tools/visualize_json_results.py``) read
from a run: its config, when they are given the run's output folder, and the class names
its boxes are labelled with, checked against the model's number of classes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, List, Optional

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from ..config.errors import ConfigError
from ..config.validate import lookup_key
from ..data.checks import num_classes_key

__all__ = ["RUN_CONFIG_FILE", "Labels", "RunSource", "class_labels", "run_source"]

#: the config a training run writes into its output folder (Detectron2's ``default_setup``)
RUN_CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class RunSource:
    """The config a picture tool reads: ``config_file`` and the overrides ``opts``;
    ``run_dir`` the run's output folder when the tool was given one ("" otherwise)."""

    config_file: str
    opts: List[str]
    run_dir: str = ""


def run_source(config: str, opts: Sequence[str]) -> RunSource:
    """``config`` is a config file, or a run's output folder: then the folder's
    ``config.yaml`` (the run's own config, its datasets and classes) with ``OUTPUT_DIR`` the
    folder (before ``opts``). Raises :class:`ConfigError` for a folder without one."""
    if not os.path.isdir(config):
        return RunSource(config, list(opts))
    path = os.path.join(config, RUN_CONFIG_FILE)
    if not os.path.isfile(path):
        raise ConfigError(
            f"{config}: a folder without {RUN_CONFIG_FILE}, not a training run's output folder; "
            "give the run's config file or the folder tools/train_net.py wrote"
        )
    return RunSource(path, ["OUTPUT_DIR", config, *opts], config)


@dataclass(frozen=True)
class Labels:
    """The labels of the boxes: ``metadata`` (a dataset's, with ``thing_classes``; None:
    class numbers), ``notes`` (lines saying which names, or why a dataset gave none) and
    ``warning`` (the model's number of classes against the names; "" when they agree)."""

    metadata: Optional[Any]
    notes: List[str] = field(default_factory=list)
    warning: str = ""


def _shown(classes: Sequence[str]) -> str:
    return ", ".join(classes[:8]) + (f", ... ({len(classes)} classes)" if len(classes) > 8 else "")


def class_labels(cfg: CfgNode, names: Sequence[str]) -> Labels:
    """The class names of the first dataset of ``names`` that has them (read from the
    dataset where registration alone does not set them: a COCO json's categories), and a
    warning where the model of ``cfg`` has another number of classes (the boxes would get
    another dataset's names)."""
    notes = []
    for name in names:
        metadata = MetadataCatalog.get(name)
        if not metadata.get("thing_classes", None) and name in DatasetCatalog.list():
            try:
                DatasetCatalog.get(name)  # loading sets thing_classes
            except Exception as e:  # the dataset's files need not be here to predict on --input
                notes.append(f"labels: {name}'s class names could not be read ({type(e).__name__}: {e})")
                continue
        classes = metadata.get("thing_classes", None)
        if classes:
            notes.append(f"labels: the class names of {name} ({_shown(classes)})")
            return Labels(metadata, notes, _mismatch(cfg, name, classes))
    notes.append("labels: class numbers (no dataset of the config names its classes)")
    return Labels(None, notes)


def _mismatch(cfg: CfgNode, name: str, classes: Sequence[str]) -> str:
    key = num_classes_key(cfg)
    if key is None:
        return ""
    num_classes = lookup_key(cfg, key)[1]
    if num_classes == len(classes):
        return ""
    return (
        f"warning: the model has {num_classes} classes ({key}) but {name} names "
        f"{len(classes)} ({_shown(classes)}): the labels are likely wrong; give the run's "
        "output folder as --config, or --dataset with the run's classes"
    )
