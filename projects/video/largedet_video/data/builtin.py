"""Datasets registered in Detectron2's ``DatasetCatalog``.

- ``moving_shapes_train`` / ``moving_shapes_val``: the built-in generated videos
  (:mod:`.moving_shapes`), with the parameters in ``cfg.DATASETS.MOVING_SHAPES``;
  generated on first use.
- ``moving_shapes_holdout_val``: where ``DATASETS.MOVING_SHAPES.HOLDOUT_NUM_VAL`` > 0, that
  many validation videos of the same generator with seed ``HOLDOUT_SEED``: a split to
  choose a recipe on, independent of the one that reports it.
- ``kinetics400_train`` / ``kinetics400_val``: the official CSVs under
  ``cfg.DATASETS.KINETICS.ROOT`` (``annotations/train.csv``,
  ``annotations/validate.csv``; videos in ``train/`` and ``val/``).
- every ``[name, list_file, root]`` of ``cfg.DATASETS.VIDEO_LISTS``.

Each dataset's ``MetadataCatalog`` entry has ``classes`` (names, when known)
and ``num_classes``.
"""

from __future__ import annotations

import os
from dataclasses import replace

from detectron2.data import DatasetCatalog, MetadataCatalog

from .lists import is_kinetics_csv, kinetics_class_names, load_kinetics_csv, load_video_list
from .moving_shapes import (
    MovingShapesSpec,
    default_datasets_root,
    load_moving_shapes,
    prepare_moving_shapes,
)

__all__ = ["register_video_datasets", "register_video_list", "moving_shapes_spec"]


def _register(name: str, loader, **metadata) -> None:
    # Re-registering replaces: the config may change between calls (tests, scripts).
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, loader)
    MetadataCatalog.get(name).set(**metadata)


def moving_shapes_spec(cfg) -> MovingShapesSpec:
    c = cfg.DATASETS.MOVING_SHAPES
    return MovingShapesSpec(
        num_train=c.NUM_TRAIN,
        num_val=c.NUM_VAL,
        num_frames=c.NUM_FRAMES,
        width=c.WIDTH,
        height=c.HEIGHT,
        seed=c.SEED,
        task=c.TASK,
        speed=tuple(float(v) for v in c.SPEED),
        slow_speed=tuple(float(v) for v in c.SLOW_SPEED),
        radius=tuple(float(v) for v in c.RADIUS),
        jitter=float(c.JITTER),
        noise=float(c.NOISE),
    )


def register_video_list(name: str, list_file: str, root: str = "", class_names=None) -> None:
    """Register ``name`` as a ``path label`` list or an official Kinetics CSV."""
    if is_kinetics_csv(list_file):
        names = list(class_names) if class_names else kinetics_class_names(list_file)
        _register(
            name,
            lambda: load_kinetics_csv(list_file, root, names)[0],
            classes=names,
            num_classes=len(names),
        )
    else:
        meta = (
            {"classes": list(class_names), "num_classes": len(class_names)} if class_names else {}
        )
        _register(name, lambda: load_video_list(list_file, root), **meta)


def register_video_datasets(cfg) -> None:
    """Register the built-in and configured video datasets for ``cfg``."""
    spec = moving_shapes_spec(cfg)
    shapes_root = cfg.DATASETS.MOVING_SHAPES.ROOT
    for split in ("train", "val"):
        _register(
            f"moving_shapes_{split}",
            lambda split=split: load_moving_shapes(prepare_moving_shapes(spec, shapes_root), split),
            classes=list(spec.classes),
            num_classes=len(spec.classes),
        )
    holdout = cfg.DATASETS.MOVING_SHAPES.HOLDOUT_NUM_VAL
    if holdout > 0:
        holdout_spec = replace(
            spec, seed=cfg.DATASETS.MOVING_SHAPES.HOLDOUT_SEED, num_train=1, num_val=holdout
        )
        _register(
            "moving_shapes_holdout_val",
            lambda: load_moving_shapes(prepare_moving_shapes(holdout_spec, shapes_root), "val"),
            classes=list(spec.classes),
            num_classes=len(spec.classes),
        )

    k_root = cfg.DATASETS.KINETICS.ROOT or os.path.join(default_datasets_root(), "kinetics400")
    train_csv = os.path.join(k_root, "annotations", "train.csv")
    for split, csv_name, folder in (
        ("train", "train.csv", "train"),
        ("val", "validate.csv", "val"),
    ):
        csv_file = os.path.join(k_root, "annotations", csv_name)
        _register(
            f"kinetics400_{split}",
            lambda csv_file=csv_file, folder=folder: load_kinetics_csv(
                csv_file, os.path.join(k_root, folder), kinetics_class_names(train_csv)
            )[0],
            num_classes=400,
        )

    for name, list_file, root in cfg.DATASETS.VIDEO_LISTS:
        register_video_list(name, list_file, root)
