"""A run's config, checked before any worker starts: each error is one line naming the key
or file.

Without these checks a bad config is a traceback from every worker, often only after the
model has been built and printed. :func:`largedet.engine.defaults.check_args` is what
``tools/train_net.py`` calls (through ``check_and_launch``) before ``launch``; the script prints ``error: <message>`` and exits 2 on a
:class:`ConfigError`. It

1. merges the config file, then the trailing ``KEY VALUE`` overrides, as Detectron2 does
   (:func:`merge_checked`): a missing or malformed file, an unknown key (with the closest
   valid one) or a value of the wrong type is a :class:`ConfigError`. An integer given on
   the command line for a float key is taken as that float (``SOLVER.BASE_LR 1``);
2. checks values against :data:`TRAINING_RULES` and the registries (:func:`check_values`):
   ``SOLVER.OPTIMIZER`` registered, ``SOLVER.PMD.PERIOD >= 1``, LRs > 0, ...;
3. checks datasets (:func:`check_datasets`): registered, and the annotation file of a
   COCO-style dataset present (the built-in shapes set is generated on first use);
4. the batch arithmetic (:func:`~largedet.solver.batch.batch_plan`) and, with AGVM, its two
   gradient estimates per step.

Other scripts (``projects/video/train.py``) run the same steps with their own config and
rules (:func:`check_config` takes extra :class:`Rule` s).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from ..checkpoint import UnsafeWeightsError, check_output_dir, load_model_zoo_pickle
from ..optim import MOMENT_DECAYS
from ..solver import OPTIMIZER_REGISTRY
from ..solver.batch import BatchPlan, batch_plan, check_agvm_estimates
from ..solver.lr_scheduler import LR_SCHEDULES, LSR_RULES
from .defaults import BUFFER_MODES, EMA_EVAL_MODES
from .device import amp_dtype

__all__ = [
    "TRAINING_RULES",
    "ConfigError",
    "Rule",
    "check_config",
    "check_datasets",
    "check_files",
    "check_values",
    "config_keys",
    "int_at_least",
    "merge_checked",
    "one_of",
]


class ConfigError(ValueError):
    """A config that cannot run. The message is one line, ``"<file or key>: <what>"``."""


# --- merging the file and the overrides ----------------------------------------------------


def config_keys(cfg: CfgNode, prefix: str = "") -> list[str]:
    """Every leaf key of ``cfg``, dotted (``"SOLVER.PMD.PERIOD"``)."""
    keys = []
    for name, value in cfg.items():
        if isinstance(value, CfgNode):
            keys += config_keys(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _lookup(tree, key: str) -> tuple[bool, Any]:
    """``(True, value)`` of the dotted ``key`` in a config or a dict, else ``(False, None)``."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _unknown_key(key: str, cfg: CfgNode) -> str:
    close = difflib.get_close_matches(key.upper(), config_keys(cfg), n=1, cutoff=0.6)
    return f"{key}: no such config key" + (f"; did you mean {close[0]}?" if close else "")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TYPE_NAMES = {
    bool: "True or False",
    int: "an integer",
    float: "a float",
    str: "a string",
    tuple: "a list",
    list: "a list",
}


def _wrong_type(key: str, default, value) -> str:
    if isinstance(default, CfgNode):
        return f"{key}: is a group of keys ({', '.join(list(default)[:3])}, ...), not a value"
    expected = _TYPE_NAMES.get(type(default), type(default).__name__)
    message = f"{key}: expected {expected}, got {value!r}"
    if isinstance(default, float) and _is_int(value):
        message += f"; write {float(value)!r}"
    return message


def _yacs_key(error: Exception) -> str | None:
    """The key that yacs names at the end of its merge errors ("... config key: A.B")."""
    match = re.search(r"config key: (\S+)$", str(error.args[0]) if error.args else "")
    return match.group(1) if match else None


def _merge_file(cfg: CfgNode, config_file: str) -> None:
    if not os.path.isfile(config_file):
        raise ConfigError(f"{config_file}: config file not found")
    defaults = cfg.clone()
    try:
        cfg.merge_from_file(config_file)
    except OSError as e:  # a _BASE_ file that is missing or unreadable
        raise ConfigError(
            f"{config_file}: cannot read {e.filename or config_file}: {e.strerror or e}"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{config_file}: not valid YAML: {' '.join(str(e).split())}") from None
    except KeyError as e:  # yacs: "Non-existent config key: A.B"
        key = _yacs_key(e)
        message = _unknown_key(key, defaults) if key else e.args[0]
        raise ConfigError(f"{config_file}: {message}") from None
    except ValueError as e:  # yacs: "Type mismatch (...) for config key: A.B"
        key = _yacs_key(e)
        if key is None:
            raise ConfigError(f"{config_file}: {' '.join(str(e).split())}") from None
        loaded = CfgNode.load_yaml_with_base(config_file, allow_unsafe=True)
        raise ConfigError(
            f"{config_file}: {_wrong_type(key, _lookup(defaults, key)[1], _lookup(loaded, key)[1])}"
        ) from None
    except (TypeError, AttributeError):  # an empty file, or a list or a scalar at the top
        raise ConfigError(f"{config_file}: not a mapping of config keys") from None
    except RecursionError:
        raise ConfigError(f"{config_file}: its _BASE_ files form a cycle") from None
    except AssertionError as e:  # Detectron2's other refusals (config version, _BASE_ types)
        raise ConfigError(f"{config_file}: cannot merge it: {' '.join(str(e).split())}") from None


def _merge_opts(cfg: CfgNode, opts: Sequence[str]) -> list[str]:
    if len(opts) % 2:
        raise ConfigError(f"{opts[-1]}: an override without a value (trailing KEY VALUE pairs)")
    merged = []
    for key, text in zip(opts[0::2], opts[1::2]):
        found, default = _lookup(cfg, key)
        if not found:
            raise ConfigError(_unknown_key(key, cfg))
        value = CfgNode._decode_cfg_value(text)  # as merge_from_list reads it
        if isinstance(default, float) and _is_int(value):
            text = repr(float(value))
        try:
            cfg.merge_from_list([key, text])
        except ValueError:
            raise ConfigError(_wrong_type(key, default, value)) from None
        merged += [key, text]
    return merged


def merge_checked(cfg: CfgNode, config_file: str | None, opts: Sequence[str]) -> list[str]:
    """Merge ``config_file`` (when given), then the ``KEY VALUE`` pairs ``opts`` into ``cfg``,
    with Detectron2's ``merge_from_file`` and ``merge_from_list``; raise :class:`ConfigError`
    where they fail: file not found or not YAML, unknown key (naming the closest valid
    key), value of the wrong type.

    Returns ``opts`` with each integer given for a float key written as that float
    (``SOLVER.BASE_LR 1`` -> ``1.0``), which ``merge_from_list`` then accepts in every
    worker; yacs refuses the integer itself. In a config file such an integer is an error
    that says what to write (``1.0``): the workers merge the file as it is.
    """
    if config_file:
        _merge_file(cfg, config_file)
    return _merge_opts(cfg, list(opts))


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A key's allowed values: ``test(value)`` must hold, as ``need`` says in words, for
    configs where ``applies(cfg)``."""

    key: str
    need: str
    test: Callable[[Any], bool]
    applies: Callable[[CfgNode], bool] = lambda cfg: True


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v) -> bool:
    return _number(v) and v > 0


def _non_negative(v) -> bool:
    return _number(v) and v >= 0


def _fraction(v) -> bool:
    return _number(v) and 0 <= v < 1


def int_at_least(low: int) -> Callable[[Any], bool]:
    """A :class:`Rule` test: an integer (not a bool) >= ``low``."""
    return lambda v: _is_int(v) and v >= low


def _pair_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(test, v))


def one_of(names: Iterable) -> tuple[str, Callable[[Any], bool]]:
    """A :class:`Rule`'s ``need`` and ``test`` for a value among ``names``."""
    names = sorted(names, key=str)
    return "one of " + ", ".join(repr(n) for n in names), lambda v: v in names


def _positive_or_none(v) -> bool:
    return v is None or _positive(v)


def _spike_factor(v) -> bool:
    return v == 0 or (_number(v) and v > 1)


def _lr_factor(v) -> bool:
    return _number(v) and 0 < v <= 1


def _clamp(v) -> bool:
    return _pair_of(_number)(v) and 0 < v[0] <= 1 <= v[1]


def _lsr(cfg: CfgNode) -> bool:
    return cfg.SOLVER.LSR.ENABLED


def _agvm(cfg: CfgNode) -> bool:
    return cfg.SOLVER.AGVM.ENABLED


def _reseed(cfg: CfgNode) -> bool:
    return cfg.RESEED_EVERY_ITER


def _ema(cfg: CfgNode) -> bool:
    return cfg.MODEL_EMA.ENABLED


def _wsd(cfg: CfgNode) -> bool:
    return cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupStableDecayLR"


#: The training keys of largedet and Detectron2 whose values are checked before launch.
TRAINING_RULES: tuple[Rule, ...] = (
    Rule("SOLVER.BASE_LR", "a number > 0", _positive, lambda cfg: not _lsr(cfg)),
    Rule("SOLVER.LSR.RULE", *one_of(LSR_RULES), _lsr),
    Rule("SOLVER.LSR.REFERENCE_BATCH", "an integer >= 1", int_at_least(1), _lsr),
    Rule("SOLVER.LSR.REFERENCE_LR", "a number > 0", _positive, _lsr),
    Rule("SOLVER.MAX_ITER", "an integer >= 1", int_at_least(1)),
    Rule("SOLVER.WARMUP_ITERS", "an integer >= 0", int_at_least(0)),
    Rule("SOLVER.CHECKPOINT_PERIOD", "an integer >= 1", int_at_least(1)),
    Rule("SOLVER.WEIGHT_DECAY", "a number >= 0", _non_negative),
    Rule("SOLVER.MOMENTUM", "a number in [0, 1)", _fraction),
    Rule("SOLVER.PMD.PERIOD", "an integer >= 1 (optimizer steps)", int_at_least(1)),
    Rule("SOLVER.PMD.DECAY", *one_of(MOMENT_DECAYS)),
    Rule("SOLVER.LAMB.BETAS", "two numbers in [0, 1)", _pair_of(_fraction)),
    Rule("SOLVER.LAMB.EPS", "a number > 0", _positive),
    Rule("SOLVER.LAMB.MAX_TRUST_RATIO", "a number > 0, or None", _positive_or_none),
    Rule("SOLVER.LARS.ETA", "a number > 0", _positive),
    Rule("SOLVER.DIVERGENCE.SPIKE_FACTOR", "0 (off) or a number > 1", _spike_factor),
    Rule("SOLVER.DIVERGENCE.WINDOW", "an integer >= 1", int_at_least(1)),
    Rule("SOLVER.DIVERGENCE.ROLLBACK_LR_FACTOR", "a number in (0, 1]", _lr_factor),
    Rule("SOLVER.DIVERGENCE.MAX_ROLLBACKS", "an integer >= 0", int_at_least(0)),
    Rule("LOG_PERIOD", "an integer >= 1", int_at_least(1)),
    Rule("SEED", "an integer >= 0 with RESEED_EVERY_ITER", int_at_least(0), _reseed),
    Rule("SOLVER.AGVM.PERIOD", "an integer >= 1", int_at_least(1), _agvm),
    Rule("SOLVER.AGVM.START_ITER", "an integer >= 0, or -1", int_at_least(-1), _agvm),
    Rule("SOLVER.AGVM.CLAMP", "(lo, hi) with 0 < lo <= 1 <= hi", _clamp, _agvm),
    Rule("SOLVER.AGVM.MOMENTUM", "a number in [0, 1)", _fraction, _agvm),
    Rule("SOLVER.AGVM.CLIP_MAX_NORM", "a number >= 0 (0: off)", _non_negative, _agvm),
    Rule("SOLVER.AGVM.CLIP_ITERS", "two integers >= 0", _pair_of(int_at_least(0)), _agvm),
    Rule("WANDB.MODE", *one_of(("", "online", "offline", "disabled"))),
    Rule("SOLVER.LR_SCHEDULER_NAME", *one_of(LR_SCHEDULES)),
    Rule("SOLVER.REFERENCE_WORLD_SIZE",
         "0 (SOLVER.IMS_PER_BATCH is the global batch on any number of devices: set "
         "SOLVER.IMS_PER_DEVICE for what one device holds, SOLVER.LSR for the LR of another batch)",
         lambda v: v == 0),  # fmt: skip
    Rule("SOLVER.WSD.DECAY_START", "a number in (0, 1)", lambda v: _number(v) and 0 < v < 1, _wsd),
    Rule("SOLVER.WARMUP_CLIP.MAX_NORM", "a number >= 0 (0: off)", _non_negative),
    Rule("SOLVER.WARMUP_CLIP.ITERS", "two integers >= 0", _pair_of(int_at_least(0))),
    Rule("MODEL_EMA.DECAY", "a number in [0, 1)", _fraction, _ema),
    Rule("MODEL_EMA.REFERENCE_BATCH", "an integer >= 0 (0: DECAY per step)", int_at_least(0), _ema),
    Rule("MODEL_EMA.BUFFERS", *one_of(BUFFER_MODES), _ema),
    Rule("MODEL_EMA.EVAL", *one_of(EMA_EVAL_MODES), _ema),
)  # fmt: skip


def _check_registered(key: str, name: str, registry) -> None:
    names = sorted(n for n, _ in registry)
    if name not in names:
        raise ConfigError(f"{key}: {name!r} is not registered; registered: {', '.join(names)}")


def check_values(cfg: CfgNode, rules: Iterable[Rule] = TRAINING_RULES) -> None:
    """Raise :class:`ConfigError` naming the first key whose value breaks its rule."""
    for rule in rules:
        if not rule.applies(cfg):
            continue
        value = _lookup(cfg, rule.key)[1]
        if not rule.test(value):
            raise ConfigError(f"{rule.key}: must be {rule.need}, got {value!r}")


def _check_training_values(cfg: CfgNode, extra_rules: Iterable[Rule]) -> None:
    _check_registered("SOLVER.OPTIMIZER", cfg.SOLVER.OPTIMIZER, OPTIMIZER_REGISTRY)
    check_values(cfg, (*TRAINING_RULES, *extra_rules))
    try:
        amp_dtype(cfg)  # names SOLVER.AMP.PRECISION
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if _agvm(cfg):
        parts = {str(part) for part, _ in cfg.SOLVER.AGVM.GROUPS}
        if cfg.SOLVER.AGVM.REFERENCE not in parts:
            raise ConfigError(
                f"SOLVER.AGVM.REFERENCE: {cfg.SOLVER.AGVM.REFERENCE!r} is not a part of "
                f"SOLVER.AGVM.GROUPS ({', '.join(sorted(parts))})"
            )


# --- datasets ----------------------------------------------------------------------------------


def _check_annotation_file(key: str, name: str) -> None:
    """A COCO-style dataset's ``json_file`` must exist, unless the dataset is generated on
    first use (the built-in shapes set carries its ``shapes_spec``)."""
    meta = MetadataCatalog.get(name)
    json_file = meta.get("json_file", None)
    if not json_file or meta.get("shapes_spec", None) is not None or os.path.isfile(json_file):
        return
    d2_root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
    hint = ""
    if os.path.normpath(json_file).startswith(os.path.normpath(d2_root) + os.sep):
        hint = f"; Detectron2's datasets are read under $DETECTRON2_DATASETS (now {d2_root!r})"
    raise ConfigError(f"{json_file}: annotation file of dataset {name!r} ({key}) not found{hint}")


def check_datasets(cfg: CfgNode, keys: Sequence[str], *, required: Sequence[str] = ()) -> None:
    """Every dataset named by the config keys ``keys`` (``"DATASETS.TRAIN"``) must be
    registered in Detectron2's ``DatasetCatalog`` (the error lists registered names close to
    it) and have its annotation file; each key in ``required`` must name at least one."""
    registered = DatasetCatalog.list()
    for key in keys:
        names = _lookup(cfg, key)[1]
        if key in required and not names:
            raise ConfigError(f"{key}: no dataset given; name at least one registered dataset")
        for name in names:
            if name not in registered:
                close = difflib.get_close_matches(name, registered, n=5, cutoff=0.6)
                hint = (
                    f"registered names close to it: {', '.join(close)}"
                    if close
                    else f"none of the {len(registered)} registered names is close to it"
                )
                raise ConfigError(f"{key}: dataset {name!r} is not registered; {hint}")
            _check_annotation_file(key, name)


# --- all together --------------------------------------------------------------------------------


def check_config(
    cfg: CfgNode, world_size: int | None, extra_rules: Iterable[Rule] = ()
) -> BatchPlan | None:
    """Check a merged config, with its datasets registered, for training on ``world_size``
    processes, or for evaluation only when ``world_size`` is None (then only the
    ``DATASETS.TEST`` datasets are checked). ``extra_rules`` are a project's own keys' rules.
    Returns the training run's :class:`BatchPlan`; raises :class:`ConfigError`."""
    if world_size is None:
        check_values(cfg, extra_rules)
        check_datasets(cfg, ("DATASETS.TEST",))
        return None
    _check_training_values(cfg, extra_rules)
    check_datasets(cfg, ("DATASETS.TRAIN", "DATASETS.TEST"), required=("DATASETS.TRAIN",))
    try:
        plan = batch_plan(cfg, world_size)
        if _agvm(cfg):
            check_agvm_estimates(plan.accumulation, world_size)
    except ValueError as e:  # their messages start with the key
        raise ConfigError(str(e)) from None
    return plan


def check_files(cfg: CfgNode, training: bool) -> None:
    """What a run writes and reads before it starts: for training, ``OUTPUT_DIR`` can be
    created and written; a ``.pkl`` ``MODEL.WEIGHTS`` holds only what a model-zoo file
    holds (read without running code). Raises :class:`ConfigError`."""
    if training:
        try:
            check_output_dir(cfg.OUTPUT_DIR)
        except OSError as e:
            raise ConfigError(str(e)) from None
    weights = cfg.MODEL.WEIGHTS
    if weights.endswith(".pkl") and os.path.isfile(weights):
        try:
            load_model_zoo_pickle(weights)
        except UnsafeWeightsError as e:
            raise ConfigError(f"MODEL.WEIGHTS: {e}") from None
