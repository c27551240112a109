"""largedet.evaluation.registry: the built-in evaluator types are registered through the
registry a user's module registers in; a test dataset whose type is not registered is one
line before launch (the trainer's choice by type: test_evaluator_selection.py)."""

import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog

from largedet.config import add_largedet_config
from largedet.config.errors import ConfigError
from largedet.evaluation import DEFAULT_EVALUATOR_TYPE, EVALUATOR_REGISTRY, check_evaluator_types


def test_coco_and_openimages_are_registry_entries():
    assert {"coco", "openimages"} <= {name for name, _ in EVALUATOR_REGISTRY}
    assert DEFAULT_EVALUATOR_TYPE == "coco"


def test_test_datasets_are_checked_by_their_type():
    cfg = add_largedet_config(get_cfg())
    for name, kind in (("registry_test_untyped", None), ("registry_test_odd", "odd")):
        if name not in DatasetCatalog.list():
            DatasetCatalog.register(name, list)
            if kind:
                MetadataCatalog.get(name).set(evaluator_type=kind)
    cfg.DATASETS.TEST = ("registry_test_untyped",)  # no type: COCO's
    check_evaluator_types(cfg)
    cfg.DATASETS.TEST = ("registry_test_untyped", "registry_test_odd")
    with pytest.raises(ConfigError) as e:
        check_evaluator_types(cfg)
    assert str(e.value).startswith(
        "DATASETS.TEST: dataset 'registry_test_odd' has evaluator_type 'odd', which is not registered in "
        "EVALUATOR_REGISTRY; registered: coco, openimages"
    )
