"""The video project's config, checked before any worker starts (``projects/video/train.py``).

largedet's checks (:mod:`largedet.config.validate`: merging, unknown keys, value types,
the solver's values, registered datasets, the batch arithmetic) plus the video keys:
:data:`VIDEO_RULES` (declared with the keys, :mod:`largedet_video.config.defaults`), the backbone registered in ``VIDEO_BACKBONE_REGISTRY``, the frame
sampling, and the files behind the datasets (Kinetics CSVs, ``DATASETS.VIDEO_LISTS`` list
files, present and their labels within ``MODEL.VIDEO.NUM_CLASSES``,
``MODEL.VIDEO.PRETRAINED``). Each error is a :class:`~largedet.config.validate.ConfigError`,
one line naming the key or file.
"""

from __future__ import annotations

import argparse
import os

from detectron2.config import CfgNode, get_cfg
from largedet.config import DeviceUnavailableError, resolve_device
from largedet.config.imports import import_run_modules
from largedet.engine import check_engine_keys, planned_world_size
from largedet.engine.defaults import check_config, check_files
from largedet.solver.batch import BatchPlan
from largedet.config.validate import ConfigError, merge_checked

from ..data import FrameSampling, register_video_datasets
from ..data.decoding import torchcodec_unavailable
from ..data.lists import is_kinetics_csv, kinetics_class_names, video_list_labels
from ..data.moving_shapes import default_datasets_root
from ..engine.defaults import DEFAULT_CONFIG
from ..modeling import VIDEO_BACKBONE_REGISTRY
from ..multigrid import multigrid_enabled
from .defaults import VIDEO_KEYS, add_video_config

__all__ = ["VIDEO_RULES", "check_video_args", "check_video_config", "video_output_dir"]


#: The video keys whose values are checked before launch, for training and evaluation:
#: each declared once with its key (:data:`largedet_video.config.VIDEO_KEYS`).
VIDEO_RULES = VIDEO_KEYS.declared_rules()


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


def _check_video_keys(cfg: CfgNode, splits) -> None:
    v = cfg.MODEL.VIDEO
    names = sorted(name for name, _ in VIDEO_BACKBONE_REGISTRY)
    if v.BACKBONE not in names:
        raise ConfigError(
            f"MODEL.VIDEO.BACKBONE: {v.BACKBONE!r} is not registered; "
            f"registered: {', '.join(names)}"
        )
    try:
        FrameSampling(cfg.INPUT.VIDEO.SAMPLING, cfg.INPUT.VIDEO.DENSE_STRIDE)
    except ValueError as e:
        raise ConfigError(f"INPUT.VIDEO.SAMPLING: {e}") from None
    if v.PRETRAINED and not os.path.isfile(os.path.expanduser(v.PRETRAINED)):
        raise ConfigError(
            f"{v.PRETRAINED}: ImageNet weights (MODEL.VIDEO.PRETRAINED) not found; set it to '' "
            "to start from scratch"
        )
    if cfg.INPUT.VIDEO.DECODER.startswith("torchcodec"):
        reason = torchcodec_unavailable()
        if reason:
            raise ConfigError(f"INPUT.VIDEO.DECODER: {cfg.INPUT.VIDEO.DECODER!r}: {reason}")
    files = _dataset_files(cfg)
    for split in splits:
        for name in cfg.DATASETS[split]:
            for path in files.get(name, ()):
                if not os.path.isfile(path):
                    raise ConfigError(
                        f"{path}: file of dataset {name!r} (DATASETS.{split}) not found"
                    )


def check_video_config(cfg: CfgNode, world_size: int | None) -> BatchPlan | None:
    """:func:`largedet.engine.defaults.check_config` with :data:`VIDEO_RULES`, then the
    video keys and the dataset files; ``world_size`` None: evaluation only (the
    ``DATASETS.TEST`` datasets). ``cfg``'s datasets must be registered
    (``register_video_datasets``)."""
    plan = check_config(cfg, world_size, VIDEO_RULES)
    splits = ("TEST",) if world_size is None else ("TRAIN", "TEST")
    _check_video_keys(cfg, splits)
    _check_labels(cfg, splits)
    if world_size is not None and cfg.SOLVER.BATCH_RAMP.BATCHES and multigrid_enabled(cfg):
        raise ConfigError(
            "SOLVER.BATCH_RAMP: a batch ramp and MULTIGRID both set the batch of each step; "
            "use one of them"
        )
    return plan


def check_video_args(
    args: argparse.Namespace, default_config: str = DEFAULT_CONFIG
) -> BatchPlan | None:
    """``projects/video/train.py``'s check before launch: merge ``--config-file`` (or
    ``default_config``) and the overrides (:func:`~largedet.config.validate.merge_checked`;
    ``args`` is not changed), import the run's modules (``IMPORTS``, ``--import``), register
    the datasets and
    check the config (:func:`check_video_config`) for the job's processes (torchrun's
    ``WORLD_SIZE``, or ``--num-gpus`` x ``--num-machines``), or for ``--eval-only``.
    Raises :class:`~largedet.config.validate.ConfigError`."""
    if not args.config_file and not os.path.isfile(default_config):
        raise ConfigError(
            f"{default_config}: the built-in demo's config is part of the largedet checkout "
            "(projects/video/configs), not of an installed package; pass --config-file"
        )
    cfg = add_video_config(get_cfg())
    merge_checked(
        cfg, args.config_file or default_config, args.opts,
        allow_python_tags=getattr(args, "allow_python_yaml", False),
    )  # fmt: skip
    import_run_modules(cfg.IMPORTS, args)  # before anything they register is looked up
    try:
        resolve_device(cfg)
    except DeviceUnavailableError as e:
        raise ConfigError(str(e)) from None
    _check_video_lists(cfg)
    register_video_datasets(cfg)
    plan = check_video_config(cfg, None if args.eval_only else planned_world_size(args))
    check_files(cfg, training=not args.eval_only, resume=args.resume)
    check_engine_keys(cfg)
    return plan


def _check_video_lists(cfg: CfgNode) -> None:
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


def _check_labels(cfg: CfgNode, splits) -> None:
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


def video_output_dir(args: argparse.Namespace, default_config: str = DEFAULT_CONFIG) -> str:
    """``OUTPUT_DIR`` of ``projects/video/train.py``'s config (``--config-file`` or
    ``default_config``, and the overrides), read without building anything: the folder the
    run owns (:class:`largedet.launch.run_lock.OutputDirLock`)."""
    cfg = add_video_config(get_cfg())
    merge_checked(
        cfg, args.config_file or default_config, args.opts,
        allow_python_tags=getattr(args, "allow_python_yaml", False),
    )  # fmt: skip
    return cfg.OUTPUT_DIR


def video_timeout_s(args: argparse.Namespace, default_config: str = DEFAULT_CONFIG) -> float:
    """``DISTRIBUTED.TIMEOUT_S`` of ``projects/video/train.py``'s config, read as
    :func:`video_output_dir` reads ``OUTPUT_DIR``: the process group's timeout."""
    cfg = add_video_config(get_cfg())
    merge_checked(
        cfg, args.config_file or default_config, args.opts,
        allow_python_tags=getattr(args, "allow_python_yaml", False),
    )  # fmt: skip
    return float(cfg.DISTRIBUTED.TIMEOUT_S)
