"""The video project's checks before launch (``projects/video/train.py``), before any worker
starts.

largedet's checks (:func:`largedet.engine.defaults.check_config`: merging, unknown keys,
value types, the solver's values, registered datasets, the batch arithmetic) plus the video
keys: :data:`VIDEO_RULES` (the keys' own rules, declared with the keys in
:mod:`largedet_video.config.defaults`, and those of the rooms that own the named parts:
:data:`~largedet_video.modeling.checks.MODEL_RULES`,
:data:`~largedet_video.data.checks.DATA_RULES`,
:data:`~largedet_video.multigrid.checks.MULTIGRID_RULES`), the backbone registered in
``VIDEO_BACKBONE_REGISTRY``, the frame sampling, and the files behind the datasets (Kinetics
CSVs, ``DATASETS.VIDEO_LISTS`` list files, present and their labels within
``MODEL.VIDEO.NUM_CLASSES``, ``MODEL.VIDEO.PRETRAINED``). Each error is a
:class:`~largedet.config.validate.ConfigError`, one line naming the key or file.
"""

from __future__ import annotations

import argparse
import os

from detectron2.config import CfgNode, get_cfg
from largedet.config import DeviceUnavailableError, resolve_device
from largedet.config.imports import import_run_modules
from largedet.config.validate import ConfigError, merge_checked
from largedet.engine import check_engine_keys, planned_world_size
from largedet.engine.defaults import check_config, check_files
from largedet.solver.batch import BatchPlan

from ..config import VIDEO_KEYS, add_video_config
from ..data import register_video_datasets
from ..data.checks import (
    DATA_RULES,
    check_dataset_files,
    check_decoder,
    check_frame_sampling,
    check_labels,
    check_video_lists,
)
from ..modeling.checks import MODEL_RULES, check_backbone_name, check_pretrained_weights
from ..multigrid.checks import MULTIGRID_RULES, check_batch_owner
from .defaults import DEFAULT_CONFIG

__all__ = ["VIDEO_RULES", "check_video_args", "check_video_config", "video_output_dir", "video_timeout_s"]


#: The video keys whose values are checked before launch, for training and evaluation:
#: each key's own rule, declared once with the key (:data:`largedet_video.config.VIDEO_KEYS`),
#: and the rules of the rooms whose parts a key names.
VIDEO_RULES = (*VIDEO_KEYS.declared_rules(), *MODEL_RULES, *DATA_RULES, *MULTIGRID_RULES)


def check_video_config(cfg: CfgNode, world_size: int | None) -> BatchPlan | None:
    """:func:`largedet.engine.defaults.check_config` with :data:`VIDEO_RULES`, then the
    video keys and the dataset files; ``world_size`` None: evaluation only (the
    ``DATASETS.TEST`` datasets). ``cfg``'s datasets must be registered
    (``register_video_datasets``)."""
    plan = check_config(cfg, world_size, VIDEO_RULES)
    splits = ("TEST",) if world_size is None else ("TRAIN", "TEST")
    check_backbone_name(cfg)
    check_frame_sampling(cfg)
    check_pretrained_weights(cfg)
    check_decoder(cfg)
    check_dataset_files(cfg, splits)
    check_labels(cfg, splits)
    if world_size is not None:
        check_batch_owner(cfg)
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
    check_video_lists(cfg)
    register_video_datasets(cfg)
    plan = check_video_config(cfg, None if args.eval_only else planned_world_size(args))
    check_files(cfg, training=not args.eval_only, resume=args.resume)
    check_engine_keys(cfg)
    return plan


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
