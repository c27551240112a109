"""The video project's config and set-up, as :mod:`largedet.engine.defaults` for detection."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Optional, Tuple

import torch
from detectron2.config import CfgNode, get_cfg
from detectron2.engine import default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from largedet.config import resolve_device
from largedet.config.imports import import_run_modules
from largedet.config.validate import merge_checked
from largedet.engine.writers import set_up_log_files, stop_log_files_on_full_disk
from largedet.model_zoo import config_roots

from ..config import add_video_config
from ..data import register_video_datasets

__all__ = ["DEFAULT_CONFIG", "build_cfg", "setup"]

logger = logging.getLogger(__name__)

#: The config of a run without ``--config-file``: the built-in CPU demo (TSM-R18 on the
#: generated moving-shapes videos), ``projects/video/configs`` of the checkout or the
#: wheel's copy (:func:`largedet.model_zoo.get_config_file`'s ``video/`` configs).
DEFAULT_CONFIG = os.path.join(config_roots()["video/"], "tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml")


def build_cfg(args: argparse.Namespace) -> CfgNode:
    """The frozen config of ``--config-file`` (default :data:`DEFAULT_CONFIG`) with the
    trailing ``KEY VALUE`` overrides, the run's modules imported (``IMPORTS`` and
    ``--import``: :func:`largedet.config.imports.import_run_modules`), ``MODEL.DEVICE`` resolved
    (:func:`largedet.config.resolve_device`: ``auto`` to ``cuda`` or ``cpu``; ``cuda``
    without a GPU raises :class:`largedet.config.DeviceUnavailableError`)."""
    return _build_cfg(args)[0]


def _build_cfg(args: argparse.Namespace) -> Tuple[CfgNode, Optional[str]]:
    cfg = add_video_config(get_cfg())
    # the safe yaml loader; an integer for a float key read as that float
    merge_checked(
        cfg, args.config_file or DEFAULT_CONFIG, args.opts,
        allow_python_tags=getattr(args, "allow_python_yaml", False),
    )  # fmt: skip
    cfg.IMPORTS = list(import_run_modules(cfg.IMPORTS, args))
    device_note = resolve_device(cfg)
    cfg.freeze()
    return cfg, device_note


def setup(args: argparse.Namespace) -> CfgNode:
    """:func:`build_cfg`, then Detectron2's ``default_setup`` (loggers, env info, config
    dump), the ``largedet`` and ``largedet_video`` loggers (console and
    ``OUTPUT_DIR/log.txt``), a line saying what ``MODEL.DEVICE auto`` resolved to,
    ``CPU_THREADS`` torch threads on the CPU, and the config's video datasets registered
    (``register_video_datasets``)."""
    cfg, device_note = _build_cfg(args)
    set_up_log_files(cfg.OUTPUT_DIR)  # log.txt stops the run in one line on a full disk
    default_setup(cfg, args)
    for name in ("largedet", "largedet_video"):
        setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name=name)
    stop_log_files_on_full_disk(cfg.OUTPUT_DIR)
    if device_note:
        (logger.warning if cfg.MODEL.DEVICE == "cpu" else logger.info)(device_note)
    if not args.config_file:
        logger.info("No --config-file given: running the built-in demo %s", DEFAULT_CONFIG)
    if cfg.CPU_THREADS and cfg.MODEL.DEVICE == "cpu":
        torch.set_num_threads(cfg.CPU_THREADS)
        logger.info("CPU_THREADS: %d torch thread(s) per process", cfg.CPU_THREADS)
    register_video_datasets(cfg)
    return cfg
