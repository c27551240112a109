"""The keys of a LazyConfig that a user may misspell, checked before launch with the closest
valid name: ``train.<key>`` (against :data:`largedet.config.lazy.TRAIN_KEYS`) and the
arguments of each ``LazyCall`` of the optimizer, the LR schedule and the model (against the
signature of what it calls), so that ``optimizer.perod=5`` is one line naming ``period``
instead of a ``TypeError`` from every worker."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any, List

from detectron2.utils.registry import locate
from omegaconf import DictConfig, OmegaConf

__all__ = ["CHECKED_PARTS", "call_argument_errors", "unknown_train_key", "with_train_names"]

#: the parts of a LazyConfig whose LazyCall arguments :func:`call_argument_errors` checks
CHECKED_PARTS = ("optimizer", "lr_multiplier", "model")


def _did_you_mean(name: str, names: Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def unknown_train_key(key: str, train_keys: Iterable[str]) -> str:
    """The line for ``train.<key>`` that is not a training key: the closest one, else where
    the keys are listed."""
    hint = _did_you_mean(key, train_keys, "train.")
    return f"train.{key}: not a largedet training key" + (
        hint or " (the keys: largedet.config.lazy.TRAIN_KEYS, docs/reference)"
    )


def with_train_names(line: str, train_keys: Mapping[str, str]) -> str:
    """``line`` of a check that names a yacs key (``SOLVER.MAX_ITER: must be ...``) with
    the LazyConfig's name of the key in front (``train.max_iter (SOLVER.MAX_ITER): ...``)."""
    key, colon, rest = line.partition(":")
    names = [name for name, yacs_key in train_keys.items() if yacs_key == key]
    return f"train.{names[0]} ({key}):{rest}" if names and colon else line


def _target(node: Mapping) -> Any:
    target = node["_target_"]
    return locate(target) if isinstance(target, str) else target


def _parameters(target) -> List[str] | None:
    """The keyword arguments ``target`` takes; None where it takes any (``**kwargs``) or its
    signature cannot be read."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _walk(node: Any, key: str, errors: List[str]) -> None:
    if isinstance(node, Mapping):
        if "_target_" in node:
            try:
                target = _target(node)
            except Exception:  # an unknown target is instantiate's own error, in one line there
                target = None
            allowed = None if target is None else _parameters(target)
            name = getattr(target, "__qualname__", getattr(target, "__name__", str(target)))
            for argument in node:
                if allowed is not None and argument != "_target_" and argument not in allowed:
                    errors.append(
                        f"{key}.{argument}: not an argument of {name}"
                        + (_did_you_mean(argument, allowed) or f"; it takes {', '.join(allowed)}")
                    )
        for name, value in node.items():
            if name != "_target_":
                _walk(value, f"{key}.{name}", errors)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _walk(value, f"{key}.{i}", errors)


def call_argument_errors(cfg: DictConfig, parts: Iterable[str] = CHECKED_PARTS) -> List[str]:
    """One line for each argument of a ``LazyCall`` under ``parts`` of ``cfg`` that what it
    calls does not take (``optimizer.perod: not an argument of PMDLAMB; did you mean
    period?``); none for a callable taking ``**kwargs``."""
    errors: List[str] = []
    for part in parts:
        if part in cfg:
            _walk(OmegaConf.to_container(cfg[part], resolve=False), part, errors)
    return errors
