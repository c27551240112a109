"""A run's config, checked before any worker starts: each error is one line naming the key.

Without these checks a bad config is a traceback from every worker, often only after the
model has been built and printed. This module checks the config alone:

1. :func:`merge_checked` merges the config file, then the trailing ``KEY VALUE`` overrides,
   as Detectron2 does, each file read once and parsed with the safe yaml loader
   (:mod:`.safe_yaml`): a ``!!python/...`` tag, a missing, non-regular, non-UTF-8 or
   malformed file, an unknown key (with the closest valid one) or a value of the wrong type
   is a :class:`ConfigError`. An integer given on the command line for a float key is
   taken as that float (``SOLVER.BASE_LR 1``);
2. :func:`check_values` and :func:`check_training_values` check values against
   :data:`TRAINING_RULES` (each key's rule, declared once with the key:
   :mod:`largedet.config.keys`): ``SOLVER.PMD.PERIOD >= 1``, LRs > 0, ...

The checks that need more than the config live beside what they check, and the entry
points call them (:func:`largedet.engine.defaults.check_config`): the optimizer's name in
its registry (:func:`largedet.solver.check_optimizer_name`), the batch arithmetic
(:func:`largedet.solver.batch.batch_plan`), the datasets and their files
(:mod:`largedet.data.checks`), the output folder and the weights
(:func:`largedet.checkpoint.check_output_dir`). This module imports no other room of
largedet.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from detectron2.config import CfgNode, get_cfg

from .defaults import add_largedet_config  # importing it declares largedet's keys
from .device import amp_dtype
from .errors import ConfigError, ConfigErrors, ErrorCollector
from .keys import Rule, _is_int, declared_rules, int_at_least, one_of, when_agvm
from .safe_yaml import load_yacs_config, merge_loaded_config

__all__ = [
    "TRAINING_RULES",
    "ConfigError",
    "ConfigErrors",
    "ErrorCollector",
    "Rule",
    "check_training_values",
    "check_values",
    "config_keys",
    "lookup_key",
    "int_at_least",
    "merge_checked",
    "warn_unused_lsr_keys",
    "one_of",
]


logger = logging.getLogger(__name__)


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


def lookup_key(tree, key: str) -> tuple[bool, Any]:
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


def _merge_file(cfg: CfgNode, config_file: str, allow_python_tags: bool) -> None:
    defaults = cfg.clone()
    # read once, checked and parsed safely: a ConfigError names the file (not found, not a
    # regular file, not UTF-8, not YAML, a Python tag, a _BASE_ cycle)
    loaded = load_yacs_config(config_file, allow_python_tags)
    try:
        merge_loaded_config(cfg, loaded, config_file)
    except KeyError as e:  # yacs: "Non-existent config key: A.B"
        key = _yacs_key(e)
        message = _unknown_key(key, defaults) if key else e.args[0]
        raise ConfigError(f"{config_file}: {message}") from None
    except ValueError as e:  # yacs: "Type mismatch (...) for config key: A.B"
        if isinstance(e, ConfigError):
            raise
        key = _yacs_key(e)
        if key is None:
            raise ConfigError(f"{config_file}: {' '.join(str(e).split())}") from None
        raise ConfigError(
            f"{config_file}: {_wrong_type(key, lookup_key(defaults, key)[1], lookup_key(loaded, key)[1])}"
        ) from None
    except (TypeError, AttributeError):  # a list or a scalar where a group of keys belongs
        raise ConfigError(f"{config_file}: not a mapping of config keys") from None
    except AssertionError as e:  # Detectron2's other refusals (config version, _BASE_ types)
        raise ConfigError(f"{config_file}: cannot merge it: {' '.join(str(e).split())}") from None


def _merge_opts(cfg: CfgNode, opts: Sequence[str], errors: ErrorCollector) -> list[str]:
    if len(opts) % 2:
        errors.add(f"{opts[-1]}: an override without a value (trailing KEY VALUE pairs)")
        opts = opts[:-1]
    merged = []
    for key, text in zip(opts[0::2], opts[1::2]):
        found, default = lookup_key(cfg, key)
        if not found:
            errors.add(_unknown_key(key, cfg))
            continue
        value = CfgNode._decode_cfg_value(text)  # as merge_from_list reads it
        if isinstance(default, float) and _is_int(value):
            text = repr(float(value))
        try:
            cfg.merge_from_list([key, text])
        except ValueError:
            errors.add(_wrong_type(key, default, value))
            continue
        merged += [key, text]
    return merged


def merge_checked(
    cfg: CfgNode,
    config_file: str | None,
    opts: Sequence[str],
    *,
    allow_python_tags: bool = False,
    errors: ErrorCollector | None = None,
) -> list[str]:
    """Merge ``config_file`` (when given), then the ``KEY VALUE`` pairs ``opts`` into ``cfg``,
    with :func:`~largedet.config.safe_yaml.load_yacs_config` (each file read once, its tags
    checked and its text parsed with the safe yaml loader; a ``!!python/...`` tag is refused
    unless ``allow_python_tags``), Detectron2's merge and ``merge_from_list``; raise
    :class:`ConfigError` where they fail: a Python tag, file not found, not a regular file,
    not UTF-8 or not YAML, unknown key (naming the closest
    valid key), value of the wrong type.

    Returns ``opts`` with each integer given for a float key written as that float
    (``SOLVER.BASE_LR 1`` -> ``1.0``), which ``merge_from_list`` then accepts in every
    worker; yacs refuses the integer itself. In a config file such an integer is an error
    that says what to write (``1.0``): the workers merge the file as it is.

    Every override is checked: the errors of all of them are raised together (one line
    each, :class:`~largedet.config.errors.ConfigErrors`), or with ``errors`` recorded there
    and the bad overrides left out of the merge and of the returned list, so that the
    checks after it run on the rest.
    """
    if config_file:
        _merge_file(cfg, config_file, allow_python_tags)
    collector = ErrorCollector() if errors is None else errors
    merged = _merge_opts(cfg, list(opts), collector)
    if errors is None:
        collector.raise_if_any()
    return merged


# --- values ----------------------------------------------------------------------------------


#: The training keys of largedet and Detectron2 whose values are checked before launch:
#: derived from their declarations (:mod:`largedet.config.keys`).
TRAINING_RULES: tuple[Rule, ...] = declared_rules()


def check_values(cfg: CfgNode, rules: Iterable[Rule] = TRAINING_RULES) -> None:
    """Raise :class:`ConfigError` naming the key whose value breaks its rule, one line for
    each such key (:class:`~largedet.config.errors.ConfigErrors` for several)."""
    errors = ErrorCollector()
    for rule in rules:
        if not rule.applies(cfg):
            continue
        value = lookup_key(cfg, rule.key)[1]
        if not rule.test(value):
            errors.add(f"{rule.key}: must be {rule.need}, got {value!r}")
    errors.raise_if_any()


def check_training_values(cfg: CfgNode, extra_rules: Iterable[Rule] = ()) -> None:
    """The values of a training run's config: every declared key's rule and ``extra_rules``
    (a project's own keys'), ``SOLVER.AMP.PRECISION`` and ``SOLVER.AGVM.REFERENCE`` among the
    parts. Raises :class:`ConfigError` naming the key, one line for each. (That
    ``SOLVER.OPTIMIZER`` is registered is the solver's check:
    :func:`largedet.solver.check_optimizer_name`.)"""
    errors = ErrorCollector()
    with errors.check():
        check_values(cfg, (*TRAINING_RULES, *extra_rules))
    try:
        amp_dtype(cfg)  # names SOLVER.AMP.PRECISION
    except ValueError as e:
        errors.add(str(e))
    if when_agvm(cfg):
        parts = {str(part) for part, _ in cfg.SOLVER.AGVM.GROUPS}
        if cfg.SOLVER.AGVM.REFERENCE not in parts:
            errors.add(
                f"SOLVER.AGVM.REFERENCE: {cfg.SOLVER.AGVM.REFERENCE!r} is not a part of "
                f"SOLVER.AGVM.GROUPS ({', '.join(sorted(parts))})"
            )
    errors.raise_if_any()


def warn_unused_lsr_keys(cfg: CfgNode) -> None:
    """Log a warning when ``SOLVER.LSR``'s reference is set but the rule is off (the LR is
    then ``SOLVER.BASE_LR``)."""
    lsr, default = cfg.SOLVER.LSR, add_largedet_config(get_cfg()).SOLVER.LSR
    if not lsr.ENABLED and (lsr.REFERENCE_BATCH, lsr.REFERENCE_LR) != (
        default.REFERENCE_BATCH,
        default.REFERENCE_LR,
    ):
        logger.warning(
            "SOLVER.LSR.REFERENCE_BATCH / REFERENCE_LR are set but SOLVER.LSR.ENABLED is false: "
            "the LR is SOLVER.BASE_LR (%g); set SOLVER.LSR.ENABLED True to scale the reference LR",
            cfg.SOLVER.BASE_LR,
        )
