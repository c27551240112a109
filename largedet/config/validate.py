"""A run's config, checked before any worker starts: each error is one line naming the key
or file.

Without these checks a bad config is a traceback from every worker, often only after the
model has been built and printed. :func:`largedet.engine.defaults.check_args` is what
``tools/train_net.py`` calls (through ``check_and_launch``) before ``launch``; the script prints ``error: <message>`` and exits 2 on a
:class:`ConfigError`. It

1. merges the config file, then the trailing ``KEY VALUE`` overrides, as Detectron2 does
   (:func:`merge_checked`, through the safe yaml loader): a ``!!python/...`` tag, a
   missing or malformed file, an unknown key (with the closest
   valid one) or a value of the wrong type is a :class:`ConfigError`. An integer given on
   the command line for a float key is taken as that float (``SOLVER.BASE_LR 1``);
2. checks values against :data:`TRAINING_RULES` (each key's rule, declared once with the
   key: :mod:`largedet.config.keys`) and the registries (:func:`check_values`):
   ``SOLVER.OPTIMIZER`` registered, ``SOLVER.PMD.PERIOD >= 1``, LRs > 0, ...;
3. checks datasets (:func:`check_datasets`): registered (else a line saying how to register
   one: ``DATASETS.COCO_JSONS``), the annotation file of a COCO-style dataset present and
   loadable (:func:`~largedet.data.check_coco_json`: JSON, category ids, boxes), its image
   folder present, an OpenImages split's files present (the built-in shapes set and the
   OpenImages fixture are generated on first use); for training, the model's number of
   classes against the categories of each COCO json it trains on
   (:func:`check_num_classes`); with the run's files (:func:`check_files`), a sample of
   each COCO json's image sizes against its images (:func:`check_image_files`);
4. the batch arithmetic (:func:`~largedet.solver.batch.batch_plan`) and, with AGVM, its two
   gradient estimates per step.

Other scripts (``projects/video/train.py``) run the same steps with their own config and
rules (:func:`check_config` takes extra :class:`Rule` s).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import yaml
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from ..checkpoint import UnsafeWeightsError, check_output_dir, check_torch_weights, load_model_zoo_pickle
from ..data.coco_json import COCO_JSONS_KEY, CocoJsonError, check_coco_json, check_image_sizes
from ..solver import OPTIMIZER_REGISTRY
from ..solver.batch import BatchPlan, batch_plan, check_agvm_estimates
from . import defaults as _defaults  # noqa: F401  (importing it declares largedet's keys)
from .device import amp_dtype
from .errors import ConfigError
from .keys import Rule, _is_int, declared_rules, int_at_least, one_of, when_agvm
from .safe_yaml import merge_config_file

__all__ = [
    "TRAINING_RULES",
    "ConfigError",
    "Rule",
    "check_config",
    "check_datasets",
    "check_files",
    "check_image_files",
    "check_num_classes",
    "check_values",
    "config_keys",
    "int_at_least",
    "merge_checked",
    "one_of",
]


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
    if not os.path.isfile(config_file):
        raise ConfigError(f"{config_file}: config file not found")
    defaults = cfg.clone()
    try:
        merge_config_file(cfg, config_file, allow_python_tags)
    except ConfigError:  # a Python tag, refused in one line before the file is loaded
        raise
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
        loaded = CfgNode.load_yaml_with_base(config_file, allow_unsafe=allow_python_tags)
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


def merge_checked(
    cfg: CfgNode, config_file: str | None, opts: Sequence[str], *, allow_python_tags: bool = False
) -> list[str]:
    """Merge ``config_file`` (when given), then the ``KEY VALUE`` pairs ``opts`` into ``cfg``,
    with :func:`~largedet.config.safe_yaml.merge_config_file` (Detectron2's
    ``merge_from_file`` with the safe yaml loader alone; a ``!!python/...`` tag is refused
    unless ``allow_python_tags``) and ``merge_from_list``; raise :class:`ConfigError` where
    they fail: a Python tag, file not found or not YAML, unknown key (naming the closest
    valid key), value of the wrong type.

    Returns ``opts`` with each integer given for a float key written as that float
    (``SOLVER.BASE_LR 1`` -> ``1.0``), which ``merge_from_list`` then accepts in every
    worker; yacs refuses the integer itself. In a config file such an integer is an error
    that says what to write (``1.0``): the workers merge the file as it is.
    """
    if config_file:
        _merge_file(cfg, config_file, allow_python_tags)
    return _merge_opts(cfg, list(opts))


# --- values ----------------------------------------------------------------------------------


#: The training keys of largedet and Detectron2 whose values are checked before launch:
#: derived from their declarations (:mod:`largedet.config.keys`).
TRAINING_RULES: tuple[Rule, ...] = declared_rules()


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
    if when_agvm(cfg):
        parts = {str(part) for part, _ in cfg.SOLVER.AGVM.GROUPS}
        if cfg.SOLVER.AGVM.REFERENCE not in parts:
            raise ConfigError(
                f"SOLVER.AGVM.REFERENCE: {cfg.SOLVER.AGVM.REFERENCE!r} is not a part of "
                f"SOLVER.AGVM.GROUPS ({', '.join(sorted(parts))})"
            )


# --- datasets ----------------------------------------------------------------------------------


def _generated(meta) -> bool:
    """Whether the dataset's files are written on first use (the built-in shapes set, the
    OpenImages fixture): nothing to check before launch."""
    return meta.get("shapes_spec", None) is not None or meta.get("generated", False)


def _d2_hint(path: str) -> str:
    d2_root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
    if os.path.normpath(path).startswith(os.path.normpath(d2_root) + os.sep):
        return f"; Detectron2's datasets are read under $DETECTRON2_DATASETS (now {d2_root!r})"
    return ""


def _check_annotation_file(key: str, name: str) -> None:
    """A dataset's ``json_file`` must exist and its ``image_root`` be a folder, and a COCO
    dataset's file (evaluator type "coco") be a COCO instances file that Detectron2 can load
    (:func:`~largedet.data.check_coco_json`), unless the dataset is generated on first use."""
    meta = MetadataCatalog.get(name)
    json_file = meta.get("json_file", None)
    if not json_file or _generated(meta):
        return
    if not os.path.isfile(json_file):
        what = "is a folder, not a file" if os.path.isdir(json_file) else "not found"
        raise ConfigError(
            f"{json_file}: annotation file of dataset {name!r} ({key}) {what}{_d2_hint(json_file)}"
        )
    image_root = meta.get("image_root", None)
    if image_root and not os.path.isdir(image_root):
        raise ConfigError(
            f"{image_root}: image folder of dataset {name!r} ({key}) not found{_d2_hint(image_root)}"
        )
    if meta.get("evaluator_type", None) != "coco":  # LVIS and other formats: present is enough
        return
    try:
        check_coco_json(json_file)
    except CocoJsonError as e:
        raise ConfigError(f"{e} (dataset {name!r}, {key})") from None


#: The OpenImages files a split's training reads, and those its evaluation reads besides
#: (:func:`largedet.data.register_openimages`'s metadata)
_OPENIMAGES_TRAIN_FILES = ("class_descriptions_csv", "class_subset_csv", "boxes_csv")
_OPENIMAGES_TEST_FILES = ("image_labels_csv", "hierarchy_json")


def _check_openimages_files(key: str, name: str) -> None:
    """An OpenImages split's official files (and its image folder) must exist, unless it is
    generated on first use."""
    meta = MetadataCatalog.get(name)
    if meta.get("evaluator_type", None) != "openimages" or _generated(meta):
        return
    fields = _OPENIMAGES_TRAIN_FILES + (_OPENIMAGES_TEST_FILES if key == "DATASETS.TEST" else ())
    for field in fields:
        path = meta.get(field, None)
        if path and not os.path.isfile(path):
            raise ConfigError(
                f"{path}: file of dataset {name!r} ({key}) not found; OpenImages is read from "
                "DATASETS.OPENIMAGES.ROOT (docs/evaluation.md)"
            )
    images_dir = meta.get("images_dir", None)
    if images_dir and not os.path.isdir(images_dir):
        raise ConfigError(
            f"{images_dir}: image folder of dataset {name!r} ({key}) not found; OpenImages is "
            "read from DATASETS.OPENIMAGES.ROOT (docs/evaluation.md)"
        )


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
                raise ConfigError(
                    f"{key}: dataset {name!r} is not registered; {hint}; register a COCO-format "
                    f"dataset with {COCO_JSONS_KEY} [[name, json_file, image_root]] "
                    "(docs/training.md#your-own-coco-dataset)"
                )
            _check_annotation_file(key, name)
            _check_openimages_files(key, name)


def _coco_json(name: str) -> tuple[str, str] | None:
    """``(json_file, image_root)`` of the COCO-format dataset ``name`` whose annotation file
    exists (checked by :func:`check_datasets`), None for another dataset or one generated on
    first use."""
    meta = MetadataCatalog.get(name)
    json_file = meta.get("json_file", None)
    if meta.get("evaluator_type", None) != "coco" or not json_file or _generated(meta):
        return None
    if not os.path.isfile(json_file):
        return None
    return json_file, meta.get("image_root", "")


def _num_classes_key(cfg: CfgNode) -> str | None:
    """The key of the model's number of classes: ``MODEL.RETINANET.NUM_CLASSES`` for a
    RetinaNet, ``MODEL.ROI_HEADS.NUM_CLASSES`` for Detectron2's other detectors; None for a
    config without either."""
    retinanet = _lookup(cfg, "MODEL.META_ARCHITECTURE")[1] == "RetinaNet"
    key = "MODEL.RETINANET.NUM_CLASSES" if retinanet else "MODEL.ROI_HEADS.NUM_CLASSES"
    return key if _lookup(cfg, key)[0] else None


def check_num_classes(names: Sequence[str], key: str, num_classes: int) -> None:
    """A model of ``num_classes`` classes (the config key ``key``) must have one for each
    category of every COCO json of the training datasets ``names``: Detectron2 maps the
    categories to ``0 .. K-1`` and would train the classes past ``num_classes`` as
    background, without a word. Raises :class:`ConfigError` naming the key, its value, the
    json and its count. More classes than categories are allowed (the extra classes are
    never trained), as Detectron2 allows them."""
    for name in names:
        found = _coco_json(name)
        if found is None:
            continue
        categories = check_coco_json(found[0]).categories
        if categories > num_classes:
            raise ConfigError(
                f"{key}: {num_classes}, but {found[0]} (dataset {name!r}) has {categories} "
                f"categories, which the model could not tell apart; set {key} {categories}"
            )


def check_image_files(cfg: CfgNode, keys: Sequence[str]) -> None:
    """For each COCO json of the datasets the config keys ``keys`` name, a sample of its
    images read from their headers (:func:`~largedet.data.check_image_sizes`): a size that
    is not the json's, or an image folder where none of them is, is a :class:`ConfigError`
    naming the json or the folder, the dataset and the key."""
    for key in keys:
        for name in _lookup(cfg, key)[1]:
            found = _coco_json(name)
            if found is None or not found[1] or not os.path.isdir(found[1]):
                continue
            json_file, image_root = found
            try:
                check_image_sizes(json_file, image_root, check_coco_json(json_file).sample)
            except CocoJsonError as e:
                raise ConfigError(f"{e} (dataset {name!r}, {key})") from None


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
    key = _num_classes_key(cfg)
    if key is not None:
        check_num_classes(cfg.DATASETS.TRAIN, key, _lookup(cfg, key)[1])
    try:
        plan = batch_plan(cfg, world_size)
        if when_agvm(cfg):
            check_agvm_estimates(plan.accumulation, world_size)
    except ValueError as e:  # their messages start with the key
        raise ConfigError(str(e)) from None
    return plan


def check_files(cfg: CfgNode, training: bool, resume: bool = False) -> None:
    """What a run writes and reads before it starts: for training, ``OUTPUT_DIR`` can be
    created and written; a local ``MODEL.WEIGHTS`` file exists (not needed where ``resume``
    and ``OUTPUT_DIR`` has a last checkpoint, which is loaded instead; URLs and
    ``detectron2://`` names are fetched by the workers) and, a ``.pkl``, holds only what a
    model-zoo file holds (read without running code); a sample of the images of each COCO
    json it trains (for training) and tests on (:func:`check_image_files`). Raises
    :class:`ConfigError`."""
    if training:
        try:
            check_output_dir(cfg.OUTPUT_DIR)
        except OSError as e:
            raise ConfigError(str(e)) from None
    weights = cfg.MODEL.WEIGHTS
    resumes = resume and os.path.isfile(os.path.join(cfg.OUTPUT_DIR, "last_checkpoint"))
    if weights and "://" not in weights and not resumes and not os.path.isfile(weights):
        what = "is a folder, not a file" if os.path.isdir(weights) else "not found"
        raise ConfigError(f"MODEL.WEIGHTS: {weights}: {what}")
    if os.path.isfile(weights):
        try:
            load_model_zoo_pickle(weights) if weights.endswith(".pkl") else check_torch_weights(weights)
        except UnsafeWeightsError as e:
            raise ConfigError(f"MODEL.WEIGHTS: {e}") from None
    check_image_files(cfg, ("DATASETS.TRAIN", "DATASETS.TEST") if training else ("DATASETS.TEST",))
