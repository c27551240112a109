"""The evaluator of a test dataset, chosen by its metadata's ``evaluator_type`` from
:data:`EVALUATOR_REGISTRY`.

A builder is a function ``builder(cfg, dataset_name, output_folder) -> DatasetEvaluator``
registered under the ``evaluator_type`` it serves, its ``__name__`` (fvcore's
``Registry``); the built-in ones are ``coco`` (largedet's
:class:`~largedet.evaluation.coco_evaluation.COCOEvaluator`, also for a dataset whose
metadata has no ``evaluator_type``) and ``openimages``
(:class:`~largedet.evaluation.OIDEvaluator`). A user adds one without editing largedet, in
a module given to ``--import``::

    from largedet.evaluation import EVALUATOR_REGISTRY

    @EVALUATOR_REGISTRY.register()
    def my_type(cfg, dataset_name, output_folder):
        return MyEvaluator(dataset_name)

    MetadataCatalog.get("my_val").set(evaluator_type="my_type")

The training scripts check every test dataset's type before launch
(:func:`check_evaluator_types`).
"""

from __future__ import annotations

from collections.abc import Sequence

from detectron2.config import CfgNode
from detectron2.data import MetadataCatalog
from detectron2.evaluation import DatasetEvaluator
from fvcore.common.registry import Registry

from .. import HAS_COMPILED_D2_OPS
from ..config.errors import ConfigError
from ..config.validate import lookup_key
from .coco_evaluation import COCOEvaluator
from .oid_evaluator import OIDEvaluator

__all__ = ["DEFAULT_EVALUATOR_TYPE", "EVALUATOR_REGISTRY", "build_evaluator", "check_evaluator_types"]

EVALUATOR_REGISTRY = Registry("EVALUATOR")
EVALUATOR_REGISTRY.__doc__ = """
Registry of evaluator builders, keyed by a dataset's metadata ``evaluator_type``. A builder
is called as ``builder(cfg, dataset_name, output_folder)`` and returns a Detectron2
``DatasetEvaluator``.
"""

#: the type of a dataset whose metadata names none
DEFAULT_EVALUATOR_TYPE = "coco"


def evaluator_type(dataset_name: str) -> str:
    """The ``evaluator_type`` of the dataset's metadata, :data:`DEFAULT_EVALUATOR_TYPE`
    where it has none."""
    return MetadataCatalog.get(dataset_name).get("evaluator_type", DEFAULT_EVALUATOR_TYPE)


def _registered() -> str:
    return ", ".join(sorted(name for name, _ in EVALUATOR_REGISTRY))


def build_evaluator(cfg: CfgNode, dataset_name: str, output_folder: str) -> DatasetEvaluator:
    """The evaluator of ``dataset_name``: the builder of :data:`EVALUATOR_REGISTRY` that its
    ``evaluator_type`` names, writing to ``output_folder``. Raises ``ValueError`` (a
    :class:`~largedet.config.errors.ConfigError`) for a type that is not registered."""
    kind = evaluator_type(dataset_name)
    if kind not in EVALUATOR_REGISTRY:
        raise ConfigError(
            f"No evaluator for dataset {dataset_name!r} (evaluator_type={kind!r}); "
            f"registered in EVALUATOR_REGISTRY: {_registered()}"
        )
    return EVALUATOR_REGISTRY.get(kind)(cfg, dataset_name, output_folder)


def check_evaluator_types(cfg: CfgNode, keys: Sequence[str] = ("DATASETS.TEST",)) -> None:
    """Every registered dataset of the config keys ``keys`` has an ``evaluator_type`` that
    :data:`EVALUATOR_REGISTRY` holds (the check before launch); raises
    :class:`~largedet.config.errors.ConfigError` naming the key, the dataset, its type and the
    registered ones."""
    for key in keys:
        for name in lookup_key(cfg, key)[1]:
            kind = evaluator_type(name)
            if kind not in EVALUATOR_REGISTRY:
                raise ConfigError(
                    f"{key}: dataset {name!r} has evaluator_type {kind!r}, which is not "
                    f"registered in EVALUATOR_REGISTRY; registered: {_registered()}"
                )


# Builders. Their names are the evaluator types they serve.


def coco(cfg: CfgNode, dataset_name: str, output_folder: str) -> DatasetEvaluator:
    """COCO box (and mask) AP: :class:`~largedet.evaluation.coco_evaluation.COCOEvaluator`,
    by Detectron2's compiled evaluator where it is built, else faster-coco-eval or
    pycocotools."""
    return COCOEvaluator(dataset_name, output_dir=output_folder, use_fast_impl=HAS_COMPILED_D2_OPS)


def openimages(cfg: CfgNode, dataset_name: str, output_folder: str) -> DatasetEvaluator:
    """The Open Images Challenge metric: :class:`~largedet.evaluation.OIDEvaluator`."""
    return OIDEvaluator(cfg, dataset_name, output_dir=output_folder)


EVALUATOR_REGISTRY.register(coco)
EVALUATOR_REGISTRY.register(openimages)
