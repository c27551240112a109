"""A Detectron2 LazyConfig (a Python config file) read as largedet's yacs config.

The parts of a largedet LazyConfig and what each may hold are described in
:mod:`largedet.engine.lazy`, whose :class:`~largedet.engine.lazy.LazyParts` are what
largedet's trainer builds one's run from.
Here: :data:`TRAIN_KEYS` (``train.<key>`` -> the yacs key it is), :func:`train_defaults`,
:func:`run_config` (the frozen yacs config of the run, computed at the edge and never
written back into the LazyConfig) and :func:`setup_lazy_config` (load, override, register
datasets, set up logging).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Tuple

from detectron2.config import CfgNode, LazyConfig, get_cfg, instantiate
from detectron2.data import (
    DatasetCatalog,
    MetadataCatalog,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.data.datasets import register_coco_instances
from detectron2.engine import default_setup
from detectron2.solver import WarmupParamScheduler
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from detectron2.utils.registry import locate
from omegaconf import DictConfig, OmegaConf


from .defaults import add_largedet_config
from .errors import ConfigError, ErrorCollector
from .imports import IMPORT_FLAG, import_modules, import_run_modules
from .safe_yaml import load_yaml_lazy_config, read_config_text
from .keys import declared_train_keys
from .lazy_checks import unknown_train_key
from .device import device_for, resolve_device

__all__ = [
    "IGNORED_DETECTRON2_KEYS",
    "TRAIN_KEYS",
    "call_target",
    "ignored_keys",
    "lazy_output_dir",
    "lazy_timeout_s",
    "load_lazy_config",
    "lr_schedule",
    "lr_schedule_within_run",
    "register_datasets",
    "run_config",
    "setup_lazy_config",
    "train_defaults",
]

logger = logging.getLogger(__name__)

#: ``train.<key>`` of a LazyConfig -> the yacs key it is (meaning, unit and scope are
#: documented there, in ``largedet/config/defaults.py`` or Detectron2's defaults): derived
#: from each key's declaration (:mod:`largedet.config.keys`).
TRAIN_KEYS: Dict[str, str] = declared_train_keys()

#: Keys of Detectron2's own LazyConfigs (its ``common/train.py``, its loaders) that largedet's
#: trainer has no use for -> why; a config holding them loads, and one line names them
#: (:func:`ignored_keys`).
IGNORED_DETECTRON2_KEYS: Dict[str, str] = {
    "train.ddp.broadcast_buffers": "largedet's DistributedDataParallel settings are its own",
    "train.ddp.find_unused_parameters": "largedet's DistributedDataParallel settings are its own",
    "train.ddp.fp16_compression": "largedet's DistributedDataParallel settings are its own",
    "dataloader.test.num_workers": "the test loader has dataloader.train.num_workers workers",
}

# dataloader.train / dataloader.test arguments -> the yacs keys largedet's loaders read
_TRAIN_LOADER_KEYS = {
    "num_workers": ("DATALOADER.NUM_WORKERS", 0),
    "aspect_ratio_grouping": ("DATALOADER.ASPECT_RATIO_GROUPING", True),
}
# the arguments a loader and its dataset may have: largedet's loaders take no others
_LOADER_ARGS = {
    "train": {"dataset", "mapper", "total_batch_size", *_TRAIN_LOADER_KEYS},
    "test": {"dataset", "mapper", "num_workers"},
}
_DATASET_ARGS = {"names", "filter_empty"}


def _yacs_defaults() -> CfgNode:
    return add_largedet_config(get_cfg())


def _get(cfg: CfgNode, key: str) -> Any:
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _set(cfg: CfgNode, key: str, value: Any, name: str) -> None:
    *parents, last = key.split(".")
    for part in parents:
        cfg = cfg[part]
    cfg[last] = _coerce(value, cfg[last], name)


def _coerce(value: Any, default: Any, name: str) -> Any:
    """``value`` in the type of the yacs default: an int where a float is expected becomes
    that float, a list where a tuple is expected that tuple; another type is an error."""
    if isinstance(value, Mapping):
        raise ValueError(f"{name}: expected a value like {default!r}, got a mapping {value!r}")
    if default is None or value is None:
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        if type(value) is not type(default):
            raise ValueError(f"{name}: expected {type(default).__name__}, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name}: expected a list, got {value!r}")
        return type(default)(value)
    if not isinstance(value, type(default)):
        raise ValueError(f"{name}: expected {type(default).__name__}, got {value!r}")
    return value


def train_defaults() -> Dict[str, Any]:
    """``train`` with every key of :data:`TRAIN_KEYS` at its yacs default, nested as in
    ``train.lsr.enabled``. A LazyConfig starts from it: ``train = train_defaults()``."""
    defaults = _yacs_defaults()
    train: Dict[str, Any] = {}
    for key, yacs_key in TRAIN_KEYS.items():
        *parents, last = key.split(".")
        node = train
        for part in parents:
            node = node.setdefault(part, {})
        value = _get(defaults, yacs_key)
        node[last] = list(value) if isinstance(value, tuple) else value
    return train


def _flatten(tree: Mapping, prefix: str = "") -> Dict[str, Any]:
    flat = {}
    for name, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{name}."))
        else:
            flat[prefix + name] = value
    return flat


def call_target(node) -> Any:
    """The callable a LazyCall node names (its ``_target_``, located when a string)."""
    target = node["_target_"]
    return locate(target) if isinstance(target, str) else target


def _target_name(node) -> str:
    target = node["_target_"]
    if isinstance(target, str):
        return target.rsplit(".", 1)[-1]
    return getattr(target, "__qualname__", getattr(target, "__name__", str(target)))


def _loader_args(cfg: DictConfig, part: str, builder) -> DictConfig:
    """``dataloader.<part>``, checked to be
    ``L(builder)(dataset=L(get_detection_dataset_dicts)(...), ...)``."""
    loader = cfg.dataloader[part]
    if call_target(loader) is not builder:
        raise ValueError(
            f"dataloader.{part}: largedet builds this loader itself from the arguments of "
            f"L({builder.__name__})(dataset=L(get_detection_dataset_dicts)(names=...), "
            f"mapper=...); got L({_target_name(loader)})"
        )
    if "dataset" not in loader or call_target(loader.dataset) is not get_detection_dataset_dicts:
        raise ValueError(
            f"dataloader.{part}.dataset must be L(get_detection_dataset_dicts)(names=...)"
        )
    for key, allowed in ((f"dataloader.{part}", _LOADER_ARGS[part]),
                         (f"dataloader.{part}.dataset", _DATASET_ARGS)):  # fmt: skip
        node = loader if key.endswith(part) else loader.dataset
        unknown = sorted(set(node) - allowed - {"_target_"})
        if unknown:
            raise ValueError(
                f"{key}.{unknown[0]}: not taken by largedet's loader, which takes "
                f"{', '.join(sorted(allowed))} (the batch is train.ims_per_batch and "
                "train.ims_per_device, the sampler a resumable one, the test loader's workers "
                "dataloader.train.num_workers)"
            )
    return loader


def ignored_keys(cfg: DictConfig) -> Tuple[str, ...]:
    """The keys of :data:`IGNORED_DETECTRON2_KEYS` that ``cfg`` sets and largedet does not
    map (a key that a largedet declaration names is mapped, not ignored)."""
    train = _flatten(OmegaConf.to_container(cfg.train, resolve=False))
    found = [f"train.{key}" for key in train if key not in TRAIN_KEYS]
    test = cfg.get("dataloader", {}).get("test", None)
    if test is not None and "num_workers" in test:
        found.append("dataloader.test.num_workers")
    return tuple(key for key in found if key in IGNORED_DETECTRON2_KEYS)


def lr_schedule(cfg: DictConfig) -> DictConfig:
    """The schedule of ``lr_multiplier`` without its warm-up: the ``scheduler`` of a
    Detectron2 ``WarmupParamScheduler`` (whose warm-up :func:`run_config` reads into
    ``SOLVER.WARMUP_*``), else ``lr_multiplier`` itself."""
    if call_target(cfg.lr_multiplier) is WarmupParamScheduler:
        return cfg.lr_multiplier.scheduler
    return cfg.lr_multiplier


def lr_schedule_within_run(cfg: DictConfig) -> Any:
    """:func:`lr_schedule` instantiated, as the yacs path builds ``SOLVER.STEPS``: milestones
    at or past the schedule's ``num_updates`` (``train.max_iter``, a short trial run's) are
    dropped, with their values, and one warning names them; the others are kept as given."""
    schedule = lr_schedule(cfg)
    milestones = list(schedule.get("milestones", None) or ())
    end = schedule.get("num_updates", None)
    kept = [m for m in milestones if end is None or m < end]
    if len(kept) == len(milestones):
        return instantiate(schedule)
    logger.warning(
        "lr_multiplier: milestones %s past the run's %d steps (train.max_iter) are ignored",
        tuple(m for m in milestones if m not in kept), end,
    )  # fmt: skip
    root = copy.deepcopy(cfg)  # interpolations (num_updates="${train.max_iter}") still resolve
    short = lr_schedule(root)
    short.milestones = kept
    short["values"] = list(short["values"])[: len(kept) + 1]
    return instantiate(short)


def _read_warmup(cfg: DictConfig, run: CfgNode) -> None:
    """``SOLVER.WARMUP_*`` from a Detectron2 ``lr_multiplier = L(WarmupParamScheduler)(...)``
    (its ``warmup_length`` is a fraction of the run), where ``train`` has no ``warmup``."""
    if "warmup" in cfg.train:
        raise ValueError(
            "lr_multiplier: a WarmupParamScheduler and train.warmup both give a warm-up; give "
            "the schedule without warm-up, or drop train.warmup"
        )
    wrapper = cfg.lr_multiplier
    run.SOLVER.WARMUP_ITERS = int(round(float(wrapper.warmup_length) * run.SOLVER.MAX_ITER))
    _set(run, "SOLVER.WARMUP_FACTOR", wrapper.warmup_factor, "lr_multiplier.warmup_factor")
    run.SOLVER.WARMUP_METHOD = str(wrapper.get("warmup_method", "linear"))
    run.SOLVER.RESCALE_INTERVAL = bool(wrapper.get("rescale_interval", False))


def _optimizer_name(cfg: DictConfig) -> str:
    """``SOLVER.OPTIMIZER`` of ``optimizer``: the registered name of its class
    (``PMDLAMB`` -> ``"PMD_LAMB"``), else the class name."""
    target = call_target(cfg.optimizer)
    path = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
    return _REGISTERED_OPTIMIZERS.get(path) or _target_name(cfg.optimizer)


#: the classes of SOLVER.OPTIMIZER's built-in builders (largedet.solver.build), by import path
_REGISTERED_OPTIMIZERS = {
    "torch.optim.sgd.SGD": "SGD",
    "torch.optim.adamw.AdamW": "AdamW",
    "largedet.optim.pmd_lamb.LAMB": "LAMB",
    "largedet.optim.pmd_lamb.PMDLAMB": "PMD_LAMB",
    "largedet.optim.lars.LARS": "LARS",
}


def _dataset_names(dataset: DictConfig, key: str) -> Tuple[str, ...]:
    names = dataset["names"]
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise ValueError(f"{key}.names: no dataset named")
    return names


def run_config(cfg: DictConfig, errors: Optional[ErrorCollector] = None) -> CfgNode:
    """The frozen yacs config of the run ``cfg`` describes, for :class:`~largedet.engine.Trainer`
    and its hooks: largedet's defaults with

    - every ``train.<key>`` at its :data:`TRAIN_KEYS` yacs key; Detectron2's keys of
      :data:`IGNORED_DETECTRON2_KEYS` are skipped, another unknown key is an error;
    - ``SOLVER.BASE_LR`` = ``optimizer.lr``, ``SOLVER.OPTIMIZER`` the optimizer's registered
      name (``"PMD_LAMB"`` for ``PMDLAMB``; the class name of another optimizer);
    - ``SOLVER.LR_SCHEDULER_NAME`` the schedule's class name and ``SOLVER.STEPS`` its
      ``milestones`` (for the log block; the schedule itself is :func:`lr_schedule`); a
      Detectron2 ``WarmupParamScheduler`` gives ``SOLVER.WARMUP_*`` (``train.warmup`` then
      absent);
    - ``DATASETS.TRAIN``, ``DATALOADER.NUM_WORKERS``, ``ASPECT_RATIO_GROUPING`` and
      ``FILTER_EMPTY_ANNOTATIONS`` from ``dataloader.train``, and its ``total_batch_size``
      (Detectron2's global batch) as ``SOLVER.IMS_PER_BATCH`` where ``train.ims_per_batch``
      is not given (given, they must agree); ``DATASETS.TEST`` from ``dataloader.test``;
    - ``MODEL.DEVICE`` resolved (:func:`~largedet.config.resolve_device`): ``auto`` to
      ``cuda`` or ``cpu``; ``cuda`` where there is no GPU is a
      :class:`~largedet.config.DeviceUnavailableError` naming ``train.device``.

    The errors of ``train`` (an unknown key, with the closest one; a value of the wrong
    type) are raised together, one line each, or with ``errors`` recorded there and the
    keys left at their defaults, for the checks after this one.
    """
    run = _yacs_defaults()
    train = OmegaConf.to_container(cfg.train, resolve=True)
    collector = ErrorCollector(catch=(ValueError,)) if errors is None else errors
    for key, value in _flatten(train).items():
        if key not in TRAIN_KEYS and f"train.{key}" in IGNORED_DETECTRON2_KEYS:
            continue
        if key not in TRAIN_KEYS:
            collector.add(unknown_train_key(key, TRAIN_KEYS))
            continue
        with collector.check():
            _set(run, TRAIN_KEYS[key], value, f"train.{key}")
    if errors is None:
        collector.raise_if_any()

    if "lr" not in cfg.optimizer:
        raise ValueError("optimizer.lr must be set: it is the peak LR (SOLVER.BASE_LR)")
    _set(run, "SOLVER.BASE_LR", cfg.optimizer.lr, "optimizer.lr")
    run.SOLVER.OPTIMIZER = _optimizer_name(cfg)

    if call_target(cfg.lr_multiplier) is WarmupParamScheduler:
        _read_warmup(cfg, run)
    schedule = lr_schedule(cfg)
    run.SOLVER.LR_SCHEDULER_NAME = _target_name(schedule)
    run.SOLVER.STEPS = tuple(schedule.get("milestones", ()))

    loader = _loader_args(cfg, "train", build_detection_train_loader)
    run.DATASETS.TRAIN = _dataset_names(loader.dataset, "dataloader.train.dataset")
    run.DATALOADER.FILTER_EMPTY_ANNOTATIONS = bool(loader.dataset.get("filter_empty", True))
    for key, (yacs_key, default) in _TRAIN_LOADER_KEYS.items():
        _set(run, yacs_key, loader.get(key, default), f"dataloader.train.{key}")
    if "total_batch_size" in loader:
        total = loader.total_batch_size
        if "ims_per_batch" in train and train["ims_per_batch"] != total:
            raise ValueError(
                f"dataloader.train.total_batch_size: {total} is not train.ims_per_batch "
                f"{train['ims_per_batch']}; give the global batch once"
            )
        _set(run, "SOLVER.IMS_PER_BATCH", total, "dataloader.train.total_batch_size")
    if "test" in cfg.dataloader:
        test = _loader_args(cfg, "test", build_detection_test_loader)
        run.DATASETS.TEST = _dataset_names(test.dataset, "dataloader.test.dataset")
    resolve_device(run, key="train.device")
    run.freeze()
    return run


# LazyConfig files loaded in this process: (real path, size, modification time) -> the config
_loaded: Dict[Tuple[str, int, int], DictConfig] = {}


def load_lazy_config(path: str, allow_python_tags: bool = False) -> DictConfig:
    """A LazyConfig file, loaded once per process and file: a later call returns a copy of
    the first load. A training script reads its config several times in one process (the
    check before launch, the output folder, ``main``), and a config's own code runs once: a
    ``register_coco_instances(...)`` in it registers its dataset once instead of raising
    Detectron2's ``already registered`` the second time.

    A yaml LazyConfig is read once and parsed with the safe loader after its tags are
    checked (:func:`~largedet.config.safe_yaml.load_yaml_lazy_config`; Detectron2's
    ``LazyConfig.load`` would parse it with ``yaml.unsafe_load``); a ``!!python/...`` tag is
    a :class:`~largedet.config.safe_yaml.PythonTagError` unless ``allow_python_tags``. A
    Python LazyConfig is Python code: it must be a regular file of UTF-8 text
    (:func:`~largedet.config.safe_yaml.read_config_text`), then Detectron2's
    ``LazyConfig.load`` runs it. Raises :class:`~largedet.config.errors.ConfigError` (one
    line naming the file) for those and where the config's code registers a dataset name
    that something else registered."""
    yaml_file = path.endswith((".yaml", ".yml"))
    if not yaml_file:  # Detectron2 refuses names other than .py in one line
        read_config_text(path)
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _loaded and yaml_file:
        _loaded[key] = load_yaml_lazy_config(path, allow_python_tags)
    elif key not in _loaded:
        try:
            _loaded[key] = LazyConfig.load(path)
        except AssertionError as e:  # Detectron2's catalogs: "Dataset 'x' is already registered!"
            raise ConfigError(f"{path}: {' '.join(str(e).split())}") from None
    return copy.deepcopy(_loaded[key])


def _register_coco_once(registration: DictConfig) -> bool:
    """For ``L(register_coco_instances)(name=..., json_file=..., image_root=...)`` whose
    name is registered already: True (nothing to do) where the registration is the same
    (json and image folder), :class:`~largedet.config.errors.ConfigError` where it is not; False
    for any other registration."""
    if call_target(registration) is not register_coco_instances:
        return False
    name = registration.get("name")
    if name not in DatasetCatalog.list():
        return False
    meta = MetadataCatalog.get(name)
    given = (registration.get("json_file"), registration.get("image_root"))
    registered = (meta.get("json_file", None), meta.get("image_root", None))
    if given != registered:
        raise ConfigError(
            f"datasets: {name!r} is registered already, with json {registered[0]} and images "
            f"{registered[1]}; this config registers {given[0]} and {given[1]}: give it another name"
        )
    return True


def register_datasets(cfg: DictConfig) -> None:
    """Instantiate each entry of ``cfg.datasets`` (dataset registrations), if any. An
    ``L(register_coco_instances)(...)`` whose dataset is registered already with the same
    json and image folder is left as it is (a script sets its config up more than once per
    process); with another json or folder it is a :class:`~largedet.config.errors.ConfigError`."""
    for name, registration in cfg.get("datasets", {}).items():
        if _register_coco_once(registration):
            continue
        logger.debug("Registering datasets %s", name)
        instantiate(registration)


def lazy_output_dir(args: argparse.Namespace) -> str:
    """``train.output_dir`` of the LazyConfig ``args.config_file`` with the overrides
    ``args.opts``: the folder the run owns. Nothing is registered; call it after
    :func:`setup_lazy_config` has checked the file."""
    cfg = LazyConfig.apply_overrides(load_lazy_config(args.config_file), args.opts or [])
    return cfg.train.output_dir


def lazy_timeout_s(args: argparse.Namespace) -> float:
    """``DISTRIBUTED.TIMEOUT_S`` of the LazyConfig ``args.config_file`` with the overrides
    ``args.opts`` (``train.distributed.timeout_s``, or the key's default): the process
    group's timeout. Nothing is registered; call it after :func:`setup_lazy_config` has
    checked the file."""
    cfg = LazyConfig.apply_overrides(load_lazy_config(args.config_file), args.opts or [])
    return float(run_config(cfg).DISTRIBUTED.TIMEOUT_S)


def setup_lazy_config(
    args: argparse.Namespace, *, log: bool = True, log_files: Optional[Callable[[str], None]] = None
) -> DictConfig:
    """Load ``args.config_file`` (once per process, a yaml file with the safe loader:
    :func:`load_lazy_config`; the modules of ``--import`` imported before, so that the file
    may name what they define), apply the trailing ``key=value`` overrides (``args.opts``),
    import the modules of ``train.imports`` (which then lists those of ``--import`` too:
    :mod:`largedet.config.imports`), register ``datasets``, and with ``log`` run
    Detectron2's ``default_setup`` (loggers, config dump to ``train.output_dir``, seeding
    with ``train.seed``) and set up the ``largedet`` logger as the yacs path does;
    ``log_files``, called with ``train.output_dir`` before, makes the log files of the run's
    folder first (as the yacs path's set-up: plain text, stopping on a full disk:
    :func:`largedet.launch.full_disk.set_up_log_files`)."""
    import_modules(getattr(args, "imports", None) or (), IMPORT_FLAG)
    cfg = load_lazy_config(args.config_file, getattr(args, "allow_python_yaml", False))
    cfg = LazyConfig.apply_overrides(cfg, args.opts or [])
    configured = cfg.train.get("imports", None) or ()
    cfg.train.imports = list(import_run_modules(configured, args, "train.imports"))
    register_datasets(cfg)
    if log:
        if log_files is not None:
            log_files(cfg.train.output_dir)
        default_setup(cfg, args)
        setup_logger(cfg.train.output_dir, distributed_rank=comm.get_rank(), name="largedet")
        device, note = device_for(cfg.train.get("device", "cuda"), "train.device")
        if note:
            (logger.warning if device == "cpu" else logger.info)(note)
        ignored = ignored_keys(cfg)
        if ignored:
            logger.warning(
                "Detectron2 keys that largedet does not use, ignored: %s", ", ".join(ignored)
            )
    return cfg
