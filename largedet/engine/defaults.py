"""Command line and set-up shared by largedet's training scripts."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from typing import Optional

import torch
from detectron2.config import CfgNode, get_cfg
from detectron2.engine import default_argument_parser, default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from ..config import add_largedet_config
from ..data import register_all_openimages, register_shapes, shapes_spec_from_config
from .batch import BatchPlan, batch_plan
from .checkpoint import AtomicCheckpointer
from .ema import ModelEMA, evaluate_with_ema
from .launch import planned_world_size

logger = logging.getLogger(__name__)


def largedet_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Detectron2's training CLI, with ``--config`` accepted for ``--config-file``."""
    parser = default_argument_parser(epilog)
    parser.add_argument(
        "--config", dest="config_file", metavar="FILE", help="alias of --config-file"
    )
    return parser


def resolve_device(cfg: CfgNode) -> None:
    """Run on the CPU when the config asks for CUDA on a machine without a GPU."""
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.info("No GPU found: MODEL.DEVICE %s -> cpu", cfg.MODEL.DEVICE)
        cfg.MODEL.DEVICE = "cpu"


def setup_cfg(args: argparse.Namespace, *, log: bool = True) -> CfgNode:
    """Build the frozen config from ``--config-file`` and trailing ``KEY VALUE`` overrides.

    Registers the built-in shapes dataset and the OpenImages splits as the config
    describes them and, with ``log``, runs Detectron2's ``default_setup`` (loggers, env info, config dump) and
    sets up the ``largedet`` logger the same way (console and ``OUTPUT_DIR/log.txt``).
    """
    cfg = get_cfg()
    add_largedet_config(cfg)
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    resolve_device(cfg)
    cfg.freeze()
    spec = shapes_spec_from_config(cfg)
    register_shapes(spec)
    if cfg.DATASETS.SHAPES.HOLDOUT_SEED >= 0:
        register_shapes(replace(spec, seed=cfg.DATASETS.SHAPES.HOLDOUT_SEED), prefix="shapes_holdout")
    register_all_openimages(
        cfg.DATASETS.OPENIMAGES.ROOT or None,
        cache_dir=cfg.DATASETS.OPENIMAGES.CACHE_DIR or None,
        expand_hierarchy=cfg.DATASETS.OPENIMAGES.EXPAND_HIERARCHY,
    )
    if log:
        default_setup(cfg, args)
        setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="largedet")
    return cfg


def check_batch_arithmetic(args: argparse.Namespace) -> BatchPlan:
    """The batch plan of the run ``args`` describe (torchrun's ``WORLD_SIZE``, or
    ``--num-gpus`` x ``--num-machines`` processes), computed before any worker is spawned;
    raises :class:`~largedet.engine.batch.BatchArithmeticError` naming the global batch, the
    world size and the per-device batch when they do not fit."""
    cfg = setup_cfg(args, log=False)
    return batch_plan(cfg, planned_world_size(args))


def train_or_evaluate(trainer_cls, cfg: CfgNode, args: argparse.Namespace) -> dict:
    """What a training script's ``main`` does with its config, in each process: with
    ``--eval-only``, build ``trainer_cls``'s model, load ``MODEL.WEIGHTS`` (with
    ``--resume``, the last checkpoint of ``OUTPUT_DIR`` where there is one) and test it;
    otherwise train a ``trainer_cls`` (``DefaultTrainer``'s interface), from the last
    checkpoint with ``--resume``. Returns the evaluation results (``{}`` when none ran).
    With ``MODEL_EMA.ENABLED``, ``--eval-only`` tests the weights ``MODEL_EMA.EVAL`` names,
    the average being the one the checkpoint holds (a warning, and the trained weights,
    where it holds none)."""
    if args.eval_only:
        model = trainer_cls.build_model(cfg)
        # largedet's checkpointer: .pkl weights are read without running code
        extra = AtomicCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        ema = _checkpoint_ema(cfg, model, extra)
        return evaluate_with_ema(trainer_cls.test, cfg, model, ema, cfg.MODEL_EMA.EVAL)
    trainer = trainer_cls(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def _checkpoint_ema(cfg: CfgNode, model, extra: dict) -> Optional[ModelEMA]:
    """The model EMA a loaded checkpoint's leftover entries ``extra`` hold, when
    ``MODEL_EMA.ENABLED``; None otherwise."""
    if not cfg.MODEL_EMA.ENABLED:
        return None
    if "model_ema" not in extra:
        logger.warning(
            "MODEL_EMA.ENABLED, but %s holds no model EMA: evaluating its trained weights",
            cfg.MODEL.WEIGHTS,
        )
        return None
    ema = ModelEMA.from_config(cfg, model)
    ema.load_state_dict(extra["model_ema"])
    return ema


def print_box_ap(results: dict) -> None:
    """Prints ``box AP: <AP>`` for a detection evaluation's results, one line per test set
    (``box AP (<dataset>): <AP>``) when there are several; from the main process only."""
    if not comm.is_main_process():
        return
    named = {"": results} if "bbox" in results else results
    for name, dataset_results in named.items():
        if isinstance(dataset_results, dict) and "bbox" in dataset_results:
            label = f" ({name})" if len(named) > 1 else ""
            print(f"box AP{label}: {dataset_results['bbox']['AP']:.1f}")
