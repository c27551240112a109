"""The trainer picks the evaluator from the dataset's ``evaluator_type``."""

import pytest
from detectron2.evaluation import COCOEvaluator

from largedet.engine import Trainer, largedet_argument_parser, setup_cfg
from largedet.evaluation import OIDEvaluator


def _cfg(*opts):
    args = largedet_argument_parser().parse_args(
        ["--config", "configs/openimages_r50_fpn_bs640.yaml", "MODEL.DEVICE", "cpu", *opts]
    )
    return setup_cfg(args, log=False)


def test_openimages_datasets_get_the_open_images_metric(tmp_path, openimages_fixture):
    cfg = _cfg("DATASETS.OPENIMAGES.ROOT", str(tmp_path))
    evaluator = Trainer.build_evaluator(cfg, "openimages_fixture_val", str(tmp_path / "eval"))
    assert isinstance(evaluator, OIDEvaluator)


def test_shapes_get_coco_and_unknown_types_fail(tiny_shapes, tmp_path):
    from detectron2.data import MetadataCatalog

    cfg = _cfg()
    assert isinstance(Trainer.build_evaluator(cfg, "tiny_shapes_val", str(tmp_path)), COCOEvaluator)
    MetadataCatalog.get("no_evaluator_set").set(evaluator_type="lvis-like")
    with pytest.raises(ValueError, match="no_evaluator_set"):
        Trainer.build_evaluator(cfg, "no_evaluator_set", str(tmp_path))
