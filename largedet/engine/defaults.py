"""Command line and set-up shared by largedet's training scripts: the parser, the config
every process builds, the check before launch, and what ``main`` does with the config."""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Optional

from detectron2.config import CfgNode, get_cfg
from detectron2.engine import default_argument_parser, default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from ..checkpoint import AtomicCheckpointer
from ..config import DeviceUnavailableError, add_largedet_config, resolve_device
from ..config.validate import ConfigError, check_config, check_files, merge_checked
from ..data import (
    CocoJsonError,
    coco_jsons_from_config,
    register_all_openimages,
    register_coco_jsons,
    register_shapes,
    shapes_spec_from_config,
)
from ..model_zoo import resolve_config_file
from ..solver.batch import BatchPlan
from .elastic import record_torchrun_job, torchrun_job_id, torchrun_resume_reason
from .ema import ModelEMA, evaluate_with_ema
from .preemption import parse_signals
from .run_summary import write_eval_results
from .launch import (
    launch,
    launched_by_torchrun,
    launched_per_process,
    planned_world_size,
    process_flags_given,
    slurm_task_environment,
)
from .run_lock import OutputDirInUseError, OutputDirLock, claim_for_fresh_run
from .writers import raise_if_a_log_found_no_space, set_up_log_files, stop_log_files_on_full_disk

logger = logging.getLogger(__name__)


def largedet_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Detectron2's training CLI, with ``--config`` accepted for ``--config-file``; a config
    that is not a file is looked up by name among largedet's own
    (:func:`largedet.model_zoo.resolve_config_file`: ``shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``
    from any folder, and from an installed wheel)."""
    parser = default_argument_parser(epilog)
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

    Resolves ``MODEL.DEVICE`` (:func:`~largedet.config.resolve_device`: ``auto`` becomes
    ``cuda`` or ``cpu``; ``cuda`` without a GPU raises
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
    (:func:`~largedet.config.validate.check_config`) for the job's processes (torchrun's
    ``WORLD_SIZE``, or ``--num-gpus`` x ``--num-machines``:
    :func:`~largedet.engine.launch.planned_world_size`), or for ``--eval-only``, with
    ``MODEL.DEVICE`` resolved on this machine, or as ``cpu`` where ``args.check_device`` is
    False (the job runs on other machines: ``tools/submit.py``); the files the run reads are
    not checked where ``args.check_data`` is False (``tools/submit.py --no-data-check``: this
    machine may not see the compute nodes' file system). ``args`` is not changed.
    Raises :class:`~largedet.config.validate.ConfigError`."""
    merge_checked(
        add_largedet_config(get_cfg()), args.config_file, args.opts,
        allow_python_tags=_allow_python_yaml(args),
    )  # fmt: skip
    if not getattr(args, "check_device", True):  # the job runs elsewhere (tools/submit.py)
        args = argparse.Namespace(**{**vars(args), "opts": [*args.opts, "MODEL.DEVICE", "cpu"]})
    try:
        cfg = setup_cfg(args, log=False)
    except (DeviceUnavailableError, CocoJsonError) as e:
        raise ConfigError(str(e)) from None
    plan = check_config(cfg, None if args.eval_only else planned_world_size(args))
    if getattr(args, "check_data", True):  # False: the files are the job's machines' (submit.py)
        check_files(cfg, training=not args.eval_only, resume=getattr(args, "resume", False))
    check_engine_keys(cfg)
    return plan


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
    names signals that can be caught. Raises :class:`~largedet.config.validate.ConfigError`."""
    try:
        parse_signals(cfg.PREEMPTION.SIGNALS)
    except ValueError as e:  # its message starts with the key
        raise ConfigError(str(e)) from None


#: seconds a process other than the job's first waits, after its check before launch failed,
#: for the first one to print the error and exit (the launcher then stops the others)
OTHER_PROCESSES_WAIT_S = 60.0


def check_and_launch(
    main_func: Callable[[argparse.Namespace], object],
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], object],
    errors: tuple[type[Exception], ...] | None = None,
    output_dir: Callable[[argparse.Namespace], str] | None = None,
    timeout_s: Callable[[argparse.Namespace], float] | None = None,
) -> None:
    """``check(args)``, then :func:`launch`. An error of ``errors`` (default
    :class:`largedet.config.validate.ConfigError`) from ``check`` is one line on stderr
    (``error: ...``) and exit status 2, before any process group or training starts; under
    torchrun every process exits so and the first one alone prints the line. Under
    torchrun, process flags given on the command line (``--num-gpus``, ``--num-machines``,
    ``--machine-rank``, ``--dist-url``, set to other than their defaults, abbreviations
    included) are named as ignored, once. With ``output_dir`` (the run's ``OUTPUT_DIR`` of
    ``args``), the first process of the job owns that folder for the run
    (:class:`~largedet.engine.run_lock.OutputDirLock`): a folder that a live run owns is
    the same one line and exit status 2, and so is a fresh training run (no ``--resume``)
    on a folder that holds a previous run's checkpoints or metrics, unless ``--overwrite``
    moves them aside (:func:`~largedet.engine.run_lock.claim_for_fresh_run`). Nothing has
    built a model yet.

    ``timeout_s`` (the run's ``DISTRIBUTED.TIMEOUT_S`` of ``args``; default: the key's
    default) is the process group's timeout. Under torchrun, a worker of a restarted job
    continues the run of ``OUTPUT_DIR`` as with ``--resume``
    (:func:`~largedet.engine.elastic.torchrun_resume_reason`: a restart after a failure, or
    the folder's run being this job's, as after a restart that admits a machine): the
    first process decides, names why in one line, and every process follows it; a lock
    still held by the job's last round is waited for up to twice the timeout."""
    if getattr(args, "launcher", None) == "slurm":  # one Slurm task: env:// from Slurm's variables
        os.environ.update(slurm_task_environment(os.environ))
    first = not launched_per_process(args) or os.environ.get("RANK", "0") == "0"
    if launched_by_torchrun() and first:
        given = process_flags_given(args)
        if given:
            print(
                f"warning: {', '.join(given)} ignored under torchrun: the job has its "
                f"{os.environ['WORLD_SIZE']} processes ({os.environ['LOCAL_WORLD_SIZE']} on "
                "this machine, torchrun's --nproc_per_node and --nnodes)",
                file=sys.stderr,
            )
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0 and torchrun_job_id() is None:
            print(
                "warning: torchrun job without --rdzv-id: a restart that admits a machine starts "
                "the run afresh; give each job its own --rdzv-id",
                file=sys.stderr,
            )
    lock = None
    timeout = None
    try:
        check(args)
        timeout = timeout_s(args) if timeout_s is not None else _default_timeout_s()
        if output_dir is not None and first and (launched_per_process(args) or args.machine_rank == 0):
            directory = output_dir(args)
            lock = OutputDirLock(directory).acquire(same_job_wait_s=2 * timeout)
            reason = torchrun_resume_reason(directory) if launched_by_torchrun() else None
            if reason and not (args.eval_only or args.resume):
                args.resume = True
                print(f"{reason}: resuming from the newest complete checkpoint of {directory}",
                      file=sys.stderr)  # fmt: skip
            if launched_by_torchrun() and not args.eval_only:
                record_torchrun_job(directory)
            if not (args.eval_only or args.resume):  # a fresh run never writes over another's
                aside = claim_for_fresh_run(directory, getattr(args, "overwrite", False))
                if aside:
                    print(f"--overwrite: the previous run's files of {directory} moved to {aside}",
                          file=sys.stderr)  # fmt: skip
    except (OutputDirInUseError, *(errors or (ConfigError,))) as e:
        if first:
            print(f"error: {e}", file=sys.stderr)
        else:
            # torchrun (and srun) stop every process as soon as one exits: the first
            # process, still checking, would be stopped before its line. It exits 2 once it
            # has printed, and the launcher stops this one then.
            time.sleep(OTHER_PROCESSES_WAIT_S)
        sys.exit(2)
    if launched_by_torchrun() and not args.eval_only:
        main_func = functools.partial(_resume_as_the_first_process, main_func)
    try:
        launch(main_func, args, timeout=timedelta(seconds=timeout))
    finally:
        if lock is not None:
            lock.release()


def _default_timeout_s() -> float:
    """``DISTRIBUTED.TIMEOUT_S``'s declared default (a script that reads no config)."""
    return float(add_largedet_config(get_cfg()).DISTRIBUTED.TIMEOUT_S)


def _resume_as_the_first_process(main_func: Callable[[argparse.Namespace], object], args) -> object:
    """``main_func(args)`` with ``args.resume`` as the job's first process decided it
    (:func:`check_and_launch`), so that every process loads the same checkpoint."""
    args.resume = comm.all_gather(bool(args.resume))[0]
    return main_func(args)



def train_or_evaluate(trainer_cls, cfg: CfgNode, args: argparse.Namespace) -> dict:
    """What a training script's ``main`` does with its config, in each process: with
    ``--eval-only``, build ``trainer_cls``'s model, load ``MODEL.WEIGHTS`` (with
    ``--resume``, the last checkpoint of ``OUTPUT_DIR`` where there is one) and test it;
    otherwise train a ``trainer_cls`` (``DefaultTrainer``'s interface), from the last
    checkpoint with ``--resume``. Returns the evaluation results (``{}`` when none ran);
    ``--eval-only`` also writes them to ``OUTPUT_DIR/eval_results.json``
    (:func:`~largedet.engine.run_summary.write_eval_results`).
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
        results = evaluate_with_ema(trainer_cls.test, cfg, model, ema, cfg.MODEL_EMA.EVAL)
        write_eval_results(cfg.OUTPUT_DIR, results)
        raise_if_a_log_found_no_space()  # log.txt on a full disk: one line, as in training
        return results
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
