"""Each config key's value rule and LazyConfig name, declared once.

largedet's own keys are declared where their defaults are, in
:func:`~largedet.config.defaults.add_largedet_config`, each by one :func:`declare` call
(default, rule, ``train.<name>`` of a LazyConfig) under its comment; Detectron2's keys
that largedet checks or maps are declared once here, in :data:`DETECTRON2_KEYS`. The checks
before launch (:data:`largedet.config.validate.TRAINING_RULES`) and the LazyConfig mapping
(:data:`largedet.config.lazy.TRAIN_KEYS`) are derived from these declarations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from detectron2.config import CfgNode

__all__ = [
    "DETECTRON2_KEYS",
    "LARGEDET_KEYS",
    "LR_SCHEDULES",
    "KeyRegistry",
    "Rule",
    "declare",
    "declared_rules",
    "declared_train_keys",
    "int_at_least",
    "one_of",
]


#: SOLVER.LR_SCHEDULER_NAME: Detectron2's three schedules and warm-up-stable-decay (each
#: built by :func:`largedet.solver.lr_scheduler.lr_multiplier`)
LR_SCHEDULES = ("WarmupMultiStepLR", "WarmupCosineLR", "WarmupStepWithFixedGammaLR", "WarmupStableDecayLR")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rule:
    """A key's allowed values: ``test(value)`` must hold, as ``need`` says in words, for
    configs where ``applies(cfg)``."""

    key: str
    need: str
    test: Callable[[Any], bool]
    applies: Callable[[CfgNode], bool] = lambda cfg: True


def number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive(v) -> bool:
    return number(v) and v > 0


def non_negative(v) -> bool:
    return number(v) and v >= 0


def fraction(v) -> bool:
    return number(v) and 0 <= v < 1


def int_at_least(low: int) -> Callable[[Any], bool]:
    """A :class:`Rule` test: an integer (not a bool) >= ``low``."""
    return lambda v: _is_int(v) and v >= low


def pair_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(test, v))


def one_of(names: Iterable) -> tuple[str, Callable[[Any], bool]]:
    """A :class:`Rule`'s ``need`` and ``test`` for a value among ``names``."""
    names = sorted(names, key=str)
    return "one of " + ", ".join(repr(n) for n in names), lambda v: v in names


def positive_or_none(v) -> bool:
    return v is None or positive(v)


def spike_factor(v) -> bool:
    return v == 0 or (number(v) and v > 1)


def lr_factor(v) -> bool:
    return number(v) and 0 < v <= 1


def clamp(v) -> bool:
    return pair_of(number)(v) and 0 < v[0] <= 1 <= v[1]


def when_lsr(cfg: CfgNode) -> bool:
    return cfg.SOLVER.LSR.ENABLED


def when_agvm(cfg: CfgNode) -> bool:
    return cfg.SOLVER.AGVM.ENABLED


def when_reseed(cfg: CfgNode) -> bool:
    return cfg.RESEED_EVERY_ITER


def when_ema(cfg: CfgNode) -> bool:
    return cfg.MODEL_EMA.ENABLED


def when_wsd(cfg: CfgNode) -> bool:
    return cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupStableDecayLR"



# --- the declarations ------------------------------------------------------------------

class KeyRegistry:
    """One project's declared keys: each key's value rule and LazyConfig name, recorded once
    by :func:`declare` (a project with keys of its own, such as the video project, keeps its
    own registry, so that largedet's checks never ask for keys a plain config lacks)."""

    def __init__(self) -> None:
        self.rules: Dict[str, Rule] = {}
        self.train_keys: Dict[str, str] = {}

    def add_rule(self, rule: Rule) -> None:
        """Record a rule for a key declared elsewhere (a Detectron2 key that this project
        restricts), once."""
        self.rules.setdefault(rule.key, rule)

    def declared_rules(self) -> Tuple[Rule, ...]:
        return tuple(self.rules.values())


#: largedet's own keys (:func:`~largedet.config.defaults.add_largedet_config`)
LARGEDET_KEYS = KeyRegistry()


def declare(
    cfg: CfgNode,
    key: str,
    default: Any,
    rule: Optional[Tuple[str, Callable[[Any], bool]]] = None,
    *,
    when: Optional[Callable[[CfgNode], bool]] = None,
    lazy: Optional[str] = None,
    registry: KeyRegistry = LARGEDET_KEYS,
) -> None:
    """Set ``key`` of ``cfg`` to ``default`` and record, once, in ``registry`` (largedet's
    by default) what the key is: its value ``rule`` (``(need, test)``, checked before launch
    where ``when(cfg)``, default always) and its LazyConfig name ``train.<lazy>``."""
    *parents, last = key.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    setattr(node, last, default)
    if rule is not None:
        registry.add_rule(Rule(key, *rule, **({"applies": when} if when else {})))
    if lazy is not None:
        registry.train_keys.setdefault(lazy, key)


def when_clip_gradients(cfg) -> bool:
    return bool(cfg.SOLVER.CLIP_GRADIENTS.ENABLED)


def _detectron2(key, rule=None, lazy=None, when=None) -> Tuple[str, Optional[Rule], Optional[str]]:
    return key, None if rule is None else Rule(key, *rule, **({"applies": when} if when else {})), lazy


#: Detectron2's keys that largedet checks before launch or maps from a LazyConfig's
#: ``train.<name>``, declared once: (key, rule or None, train name or None). Their defaults
#: and meanings are Detectron2's.
DETECTRON2_KEYS: Tuple[Tuple[str, Optional[Rule], Optional[str]], ...] = (
    _detectron2("OUTPUT_DIR", lazy="output_dir"),
    _detectron2("MODEL.WEIGHTS", lazy="init_checkpoint"),
    _detectron2("MODEL.DEVICE", lazy="device"),
    _detectron2("SEED", ("an integer >= 0 with RESEED_EVERY_ITER", int_at_least(0)), "seed", when_reseed),
    _detectron2("DATALOADER.NUM_WORKERS", ("an integer >= 0 (loader processes per training process)", int_at_least(0))),
    _detectron2("CUDNN_BENCHMARK", lazy="cudnn_benchmark"),
    _detectron2("SOLVER.BASE_LR", ("a number > 0", positive), when=lambda cfg: not when_lsr(cfg)),
    _detectron2("SOLVER.MAX_ITER", ("an integer >= 1", int_at_least(1)), "max_iter"),
    _detectron2("SOLVER.IMS_PER_BATCH", lazy="ims_per_batch"),
    _detectron2("SOLVER.WARMUP_ITERS", ("an integer >= 0", int_at_least(0)), "warmup.iters"),
    _detectron2("SOLVER.WARMUP_FACTOR", lazy="warmup.factor"),
    _detectron2("SOLVER.WARMUP_METHOD", lazy="warmup.method"),
    _detectron2("SOLVER.RESCALE_INTERVAL", lazy="warmup.rescale_interval"),
    _detectron2("SOLVER.AMP.ENABLED", lazy="amp.enabled"),
    _detectron2("SOLVER.CLIP_GRADIENTS.ENABLED", lazy="clip_gradients.enabled"),
    _detectron2(
        "SOLVER.CLIP_GRADIENTS.CLIP_TYPE",
        one_of(("value", "norm", "full_model")),
        "clip_gradients.clip_type",
        when_clip_gradients,
    ),
    _detectron2("SOLVER.CLIP_GRADIENTS.CLIP_VALUE", ("a number > 0", positive), "clip_gradients.clip_value",
                when_clip_gradients),  # fmt: skip
    _detectron2("SOLVER.CLIP_GRADIENTS.NORM_TYPE", ("a number > 0 (inf: the largest element)", positive),
                "clip_gradients.norm_type", when_clip_gradients),  # fmt: skip
    _detectron2("SOLVER.CHECKPOINT_PERIOD", ("an integer >= 1", int_at_least(1)), "checkpointer.period"),
    _detectron2("TEST.EVAL_PERIOD", lazy="eval_period"),
    _detectron2("SOLVER.WEIGHT_DECAY", ("a number >= 0", non_negative)),
    _detectron2("SOLVER.MOMENTUM", ("a number in [0, 1)", fraction)),
    _detectron2("SOLVER.LR_SCHEDULER_NAME", one_of(LR_SCHEDULES)),
    _detectron2(
        "SOLVER.REFERENCE_WORLD_SIZE",
        ("0 (SOLVER.IMS_PER_BATCH is the global batch on any number of devices: set "
         "SOLVER.IMS_PER_DEVICE for what one device holds, SOLVER.LSR for the LR of another batch)",
         lambda v: v == 0),
    ),  # fmt: skip
)


def declared_rules() -> Tuple[Rule, ...]:
    """Every declared rule: Detectron2's keys', then largedet's in declaration order (the
    keys of :func:`~largedet.config.defaults.add_largedet_config` are declared when it
    first runs, which importing :mod:`largedet.config.defaults` does)."""
    return tuple(rule for _, rule, _ in DETECTRON2_KEYS if rule is not None) + LARGEDET_KEYS.declared_rules()


def declared_train_keys() -> Dict[str, str]:
    """``train.<name>`` of a LazyConfig -> the yacs key it is: Detectron2's, then largedet's."""
    names = {lazy: key for key, _, lazy in DETECTRON2_KEYS if lazy is not None}
    names.update(LARGEDET_KEYS.train_keys)
    return names
