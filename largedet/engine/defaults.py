"""Command line and set-up shared by largedet's training scripts: the parser, the config
every process builds, the check before launch, and what ``main`` does with the config."""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import replace
from collections.abc import Iterable
from typing import Optional

from detectron2.config import CfgNode, get_cfg
from detectron2.engine import default_argument_parser, default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from ..checkpoint import AtomicCheckpointer
from ..config import DeviceUnavailableError, add_largedet_config, resolve_device
from ..config.imports import add_import_argument, import_run_modules
from ..checkpoint.checks import check_output_and_weights
from ..config.keys import Rule, when_agvm
from ..config.errors import ErrorCollector
from ..config.validate import ConfigError, check_training_values, check_values, lookup_key, merge_checked
from ..data import (
    CocoJsonError,
    coco_jsons_from_config,
    register_all_openimages,
    register_coco_jsons,
    register_shapes,
    shapes_spec_from_config,
)
from ..evaluation.registry import check_evaluator_types
from ..model_zoo import resolve_config_file
from ..modeling.checks import check_model_names
from ..data.checks import check_datasets, check_image_files, check_num_classes, num_classes_key
from ..solver import check_optimizer_name
from ..solver.batch import BatchPlan, batch_plan, check_agvm_estimates
from .ema import ModelEMA, evaluate_with_ema
from .hooks import check_hook_names
from .parts import TrainerParts
from ..launch.preemption import parse_signals
from ..launch.run_summary import write_eval_results
from ..launch.processes import planned_world_size
from .writers import raise_if_a_log_found_no_space, set_up_log_files, stop_log_files_on_full_disk

logger = logging.getLogger(__name__)


class _FlagsAfterOverrides(argparse.ArgumentParser):
    """A parser whose flags may also follow the trailing ``KEY VALUE`` overrides
    (``... SOLVER.MAX_ITER 10 --num-gpus 2``): a known flag where a key would be is read as
    that flag (no config key starts with ``--``); one where a value would be stays the
    value."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        opts = list(parsed.opts or [])
        flags = {s for action in self._actions for s in action.option_strings if s.startswith("--")}
        for i in range(0, len(opts), 2):
            if opts[i].split("=", 1)[0] not in flags:
                continue
            rest, more = self.parse_known_args(opts[i:])
            for name, value in vars(rest).items():
                if name == "opts":
                    continue
                if isinstance(value, list):  # a repeatable flag (--import): both places'
                    setattr(parsed, name, [*getattr(parsed, name), *value])
                elif value != self.get_default(name):
                    setattr(parsed, name, value)
            parsed.opts = opts[:i] + list(rest.opts or [])
            return parsed, extras + more
        return parsed, extras


def largedet_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Detectron2's training CLI, with ``--config`` accepted for ``--config-file``; a config
    that is not a file is looked up by name among largedet's own
    (:func:`largedet.model_zoo.resolve_config_file`: ``shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``
    from any folder, and from an installed wheel); ``--import MODULE``, a user's module
    imported in every process (:mod:`largedet.config.imports`). The flags may also come
    after the trailing ``KEY VALUE`` overrides."""
    detectron2 = default_argument_parser(epilog)
    parser = _FlagsAfterOverrides(
        parents=[detectron2], add_help=False, epilog=detectron2.epilog,
        formatter_class=detectron2.formatter_class,
    )  # fmt: skip
    add_import_argument(parser)
    parser.add_argument(
        "--config", dest="config_file", metavar="FILE", help="alias of --config-file"
    )
    for action in parser._actions:
        if action.dest == "config_file":
            action.type = resolve_config_file
    parser.add_argument(
        "--launcher",
        choices=("detectron2", "slurm"),
        default="detectron2",
        help="detectron2: start --num-gpus processes per machine (Detectron2's launch); slurm: "
        "this process is one Slurm task of srun, its rank, world size and rendezvous read from "
        "SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and the job's first node (or MASTER_ADDR, "
        "MASTER_PORT)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start a fresh run on an OUTPUT_DIR that holds a previous run's checkpoints or "
        "metrics: its files are moved to OUTPUT_DIR/overwritten_<time>/ first (without it, and "
        "without --resume, such a folder is refused)",
    )
    parser.add_argument(
        "--allow-python-yaml",
        action="store_true",
        help="load a config file (or _BASE_ file) holding !!python/... tags, which can run "
        "code, with yaml.unsafe_load (a warning names them); without it such a file is refused",
    )
    return parser


def _allow_python_yaml(args: argparse.Namespace) -> bool:
    """``--allow-python-yaml``; False for a command line without the flag."""
    return getattr(args, "allow_python_yaml", False)


def setup_cfg(args: argparse.Namespace, *, log: bool = True) -> CfgNode:
    """Build the frozen config from ``--config-file`` and trailing ``KEY VALUE`` overrides.

    Imports the run's modules first (``IMPORTS`` and ``--import``, which ``IMPORTS`` then
    lists: :func:`~largedet.config.imports.import_run_modules`), in every process that
    builds the config. Resolves ``MODEL.DEVICE`` (:func:`~largedet.config.resolve_device`:
    ``auto`` becomes ``cuda`` or ``cpu``; ``cuda`` without a GPU raises
    :class:`~largedet.config.DeviceUnavailableError`), registers the ``DATASETS.COCO_JSONS``
    datasets (:func:`~largedet.data.register_coco_jsons`; :class:`~largedet.data.CocoJsonError`),
    the built-in shapes dataset and the OpenImages splits as the config describes them and,
    with ``log``, runs Detectron2's ``default_setup`` (loggers, env info, config dump), sets
    up the ``largedet`` logger the same way (console and ``OUTPUT_DIR/log.txt``) and logs
    what ``auto`` resolved to.
    """
    cfg = get_cfg()
    add_largedet_config(cfg)
    # the safe yaml loader; an integer for a float key read as that float
    merge_checked(cfg, args.config_file, args.opts, allow_python_tags=_allow_python_yaml(args))
    cfg.IMPORTS = list(import_run_modules(cfg.IMPORTS, args))
    device_note = resolve_device(cfg)
    cfg.freeze()
    register_coco_jsons(coco_jsons_from_config(cfg))
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
        set_up_log_files(cfg.OUTPUT_DIR)  # log.txt stops the run in one line on a full disk
        default_setup(cfg, args)
        setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="largedet")
        stop_log_files_on_full_disk(cfg.OUTPUT_DIR)
        if device_note:
            (logger.warning if cfg.MODEL.DEVICE == "cpu" else logger.info)(device_note)
    return cfg


def check_args(args: argparse.Namespace) -> BatchPlan | None:
    """``tools/train_net.py``'s check before ``launch``: merge ``--config-file`` and the
    overrides (:func:`~largedet.config.validate.merge_checked`), build the config every
    worker will (:func:`setup_cfg`) and check it
    (:func:`check_config`; and each test dataset's evaluator:
    :func:`~largedet.evaluation.check_evaluator_types`) for the job's processes (torchrun's
    ``WORLD_SIZE``, or ``--num-gpus`` x ``--num-machines``:
    :func:`~largedet.launch.processes.planned_world_size`), or for ``--eval-only``, with
    ``MODEL.DEVICE`` resolved on this machine, or as ``cpu`` where ``args.check_device`` is
    False (the job runs on other machines: ``tools/submit.py``); the files the run reads are
    not checked where ``args.check_data`` is False (``tools/submit.py --no-data-check``: this
    machine may not see the compute nodes' file system). ``args`` is not changed.
    Raises :class:`~largedet.config.validate.ConfigError` with every error found, one line
    each: the checks go on past a bad override (left out) and past each failed check."""
    errors = ErrorCollector()
    good_opts = merge_checked(  # the overrides that merge; the others' errors recorded
        add_largedet_config(get_cfg()), args.config_file, args.opts,
        allow_python_tags=_allow_python_yaml(args), errors=errors,
    )  # fmt: skip
    if not getattr(args, "check_device", True):  # the job runs elsewhere (tools/submit.py)
        good_opts = [*good_opts, "MODEL.DEVICE", "cpu"]
    args = argparse.Namespace(**{**vars(args), "opts": good_opts})
    try:
        cfg = setup_cfg(args, log=False)
    except (DeviceUnavailableError, CocoJsonError) as e:
        errors.add(str(e))
        errors.raise_if_any()
    batch = None  # the batch arithmetic's result, where its check passed
    with errors.check():
        batch = check_config(cfg, None if args.eval_only else planned_world_size(args))
    with errors.check():
        check_evaluator_types(cfg)
    # the output folder's check makes it (a write probe): only for a run that can start;
    # check_data False: the files are the job's machines' (submit.py)
    if getattr(args, "check_data", True) and not errors:
        with errors.check():
            check_files(cfg, training=not args.eval_only, resume=getattr(args, "resume", False))
    with errors.check():
        check_engine_keys(cfg)
    errors.raise_if_any()
    return batch


def check_config(
    cfg: CfgNode, world_size: int | None, extra_rules: Iterable[Rule] = ()
) -> BatchPlan | None:
    """Check a merged config, with its datasets registered, for training on ``world_size``
    processes, or for evaluation only when ``world_size`` is None (then only the
    ``DATASETS.TEST`` datasets are checked): its values
    (:func:`~largedet.config.validate.check_training_values`, ``extra_rules`` a project's own
    keys' rules), the model's parts in Detectron2's registries
    (:func:`~largedet.modeling.checks.check_model_names`), the optimizer's name
    (:func:`~largedet.solver.check_optimizer_name`), the datasets and the classes
    (:mod:`largedet.data.checks`), the batch arithmetic and AGVM's two estimates
    (:mod:`largedet.solver.batch`). Returns the training run's :class:`BatchPlan`; raises
    :class:`ConfigError`, one line for each error found (the batch arithmetic is checked
    where the values passed)."""
    errors = ErrorCollector()
    with errors.check():
        check_model_names(cfg)
    if world_size is None:
        with errors.check():
            check_values(cfg, extra_rules)
        with errors.check():
            check_datasets(cfg, ("DATASETS.TEST",))
        errors.raise_if_any()
        return None
    with errors.check():
        check_optimizer_name(cfg)
    with errors.check():
        check_training_values(cfg, extra_rules)
    values_ok = not errors  # the batch arithmetic needs valid values
    with errors.check():
        check_datasets(cfg, ("DATASETS.TRAIN", "DATASETS.TEST"), required=("DATASETS.TRAIN",))
        key = num_classes_key(cfg)  # of registered datasets only
        if key is not None:
            check_num_classes(cfg.DATASETS.TRAIN, key, lookup_key(cfg, key)[1])
    batch = None  # where the values passed, the batch arithmetic's result
    if values_ok:
        try:
            batch = batch_plan(cfg, world_size)
            if when_agvm(cfg):
                check_agvm_estimates(batch.accumulation, world_size)
        except ValueError as e:  # their messages start with the key
            errors.add(str(e))
    errors.raise_if_any()
    return batch


def check_files(cfg: CfgNode, training: bool, resume: bool = False) -> None:
    """What a run writes and reads before it starts: the output folder and the weights
    (:func:`~largedet.checkpoint.checks.check_output_and_weights`) and a sample of the images
    of each COCO json it trains (for training) and tests on
    (:func:`~largedet.data.checks.check_image_files`). Raises :class:`ConfigError`."""
    check_output_and_weights(cfg, training, resume)
    check_image_files(cfg, ("DATASETS.TRAIN", "DATASETS.TEST") if training else ("DATASETS.TEST",))


def config_output_dir(args: argparse.Namespace) -> str:
    """``OUTPUT_DIR`` of ``tools/train_net.py``'s config (``--config-file`` and the
    overrides), read without building anything."""
    cfg = add_largedet_config(get_cfg())
    merge_checked(cfg, args.config_file, args.opts, allow_python_tags=_allow_python_yaml(args))
    return cfg.OUTPUT_DIR


def config_timeout_s(args: argparse.Namespace) -> float:
    """``DISTRIBUTED.TIMEOUT_S`` of ``tools/train_net.py``'s config (``--config-file`` and
    the overrides), read without building anything: the process group's timeout."""
    cfg = add_largedet_config(get_cfg())
    merge_checked(cfg, args.config_file, args.opts, allow_python_tags=_allow_python_yaml(args))
    return float(cfg.DISTRIBUTED.TIMEOUT_S)


def check_engine_keys(cfg: CfgNode) -> None:
    """The keys that the trainer's hooks read, checked before launch: ``PREEMPTION.SIGNALS``
    names signals that can be caught, ``HOOKS`` registered hooks
    (:func:`~largedet.engine.hooks.check_hook_names`). Raises
    :class:`~largedet.config.validate.ConfigError`."""
    try:
        parse_signals(cfg.PREEMPTION.SIGNALS)
    except ValueError as e:  # its message starts with the key
        raise ConfigError(str(e)) from None
    check_hook_names(cfg)


def train_or_evaluate(
    trainer_cls, cfg: CfgNode, args: argparse.Namespace, parts: Optional[TrainerParts] = None
) -> dict:
    """What a training script's ``main`` does with its config, in each process: with
    ``--eval-only``, build the model of ``parts`` (:mod:`largedet.engine.parts`; default
    ``trainer_cls``'s builders), load ``MODEL.WEIGHTS`` (with
    ``--resume``, the last checkpoint of ``OUTPUT_DIR`` where there is one) and test it;
    otherwise train a ``trainer_cls`` (``DefaultTrainer``'s interface) with ``parts``, from the last
    checkpoint with ``--resume``. Returns the evaluation results (``{}`` when none ran);
    ``--eval-only`` also writes them to ``OUTPUT_DIR/eval_results.json``
    (:func:`~largedet.launch.run_summary.write_eval_results`).
    With ``MODEL_EMA.ENABLED``, ``--eval-only`` tests the weights ``MODEL_EMA.EVAL`` names,
    the average being the one the checkpoint holds (a warning, and the trained weights,
    where it holds none)."""
    if args.eval_only:
        parts = TrainerParts(trainer_cls) if parts is None else parts
        model = parts.build_model(cfg)
        # largedet's checkpointer: .pkl weights are read without running code
        extra = AtomicCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        ema = _checkpoint_ema(cfg, model, extra)
        results = evaluate_with_ema(parts.test, cfg, model, ema, cfg.MODEL_EMA.EVAL)
        write_eval_results(cfg.OUTPUT_DIR, results)
        raise_if_a_log_found_no_space()  # log.txt on a full disk: one line, as in training
        return results
    trainer = trainer_cls(cfg) if parts is None else trainer_cls(cfg, parts=parts)
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
    (``box AP (<dataset>): <AP>``) when there are several, ``n/a`` where the AP is undefined
    (NaN: a ground truth without annotations); from the main process only."""
    if not comm.is_main_process():
        return
    named = {"": results} if "bbox" in results else results
    for name, dataset_results in named.items():
        if isinstance(dataset_results, dict) and "bbox" in dataset_results:
            label = f" ({name})" if len(named) > 1 else ""
            ap = dataset_results["bbox"]["AP"]
            print(f"box AP{label}: {'n/a' if math.isnan(ap) else format(ap, '.1f')}")
