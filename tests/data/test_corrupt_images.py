"""Unreadable images (a truncated JPEG, random bytes, a deleted file): skipped with the
file and the reason; in training the next image takes the place of one, in evaluation it
is left out of the metric and counted."""

import itertools
import logging
import re

import pytest
import torch
from torch import nn
from unreadable_testing import REASONS, damaged_copies, register

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, DatasetMapper
from detectron2.data.detection_utils import SizeMismatchError
from detectron2.evaluation import COCOEvaluator as DetectronCOCOEvaluator
from detectron2.evaluation import inference_on_dataset
from detectron2.structures import Boxes, BoxMode, Instances
from largedet.config import add_largedet_config
from largedet.data.unreadable import SkipUnreadable
from largedet.engine import Trainer
from largedet.data.build import ResumableTrainingSampler, TrainBatches

TRAIN_DAMAGE = {2: "truncated", 9: "random_bytes", 17: "deleted"}
VAL_DAMAGE = {1: "truncated", 4: "random_bytes", 6: "deleted"}


@pytest.fixture(scope="module")
def damaged_train(tiny_shapes, tmp_path_factory):
    dicts = DatasetCatalog.get("tiny_shapes_train")
    return damaged_copies(dicts, tmp_path_factory.mktemp("damaged_train"), TRAIN_DAMAGE)


@pytest.fixture
def largedet_log(caplog):
    """largedet's warnings in ``caplog`` (its logger does not propagate once set up)."""
    logger = logging.getLogger("largedet")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False
    try:
        with caplog.at_level(logging.WARNING, logger="largedet"):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def _cfg(output_dir="", *opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", "cpu",
            "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64",
            "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "64",
            "INPUT.RANDOM_FLIP", "none",
            "DATALOADER.NUM_WORKERS", "0",
            "OUTPUT_DIR", str(output_dir),
        ]
        + [str(o) for o in opts]
    )  # fmt: skip
    return cfg


def test_each_unreadable_image_maps_to_none_with_its_file_and_reason(damaged_train, largedet_log):
    mapper = SkipUnreadable(DatasetMapper(_cfg(), is_train=False))
    for i in TRAIN_DAMAGE:
        assert mapper(damaged_train[i]) is None
    assert mapper(damaged_train[0])["image"].shape == (3, 64, 64)
    assert mapper.num_skipped == 3
    messages = [r.getMessage() for r in largedet_log.records]
    assert len(messages) == 3
    for message, (i, kind) in zip(messages, TRAIN_DAMAGE.items()):
        assert damaged_train[i]["file_name"] in message and REASONS[kind] in message


def test_unreadable_images_in_a_row_stop_the_run_naming_the_last(damaged_train):
    bad = [damaged_train[i] for i in TRAIN_DAMAGE]
    mapper = SkipUnreadable(DatasetMapper(_cfg(), is_train=False), max_consecutive_skips=2)
    assert mapper(bad[0]) is None and mapper(bad[1]) is None
    with pytest.raises(RuntimeError, match=re.escape(bad[2]["file_name"])):
        mapper(bad[2])
    # a readable image in between starts the count again
    mapper = SkipUnreadable(DatasetMapper(_cfg(), is_train=False), max_consecutive_skips=1)
    assert mapper(bad[0]) is None
    assert mapper(damaged_train[0]) is not None
    assert mapper(bad[1]) is None


def test_other_errors_are_not_taken_for_unreadable_images(damaged_train):
    wrong_size = dict(damaged_train[0], width=65)
    with pytest.raises(SizeMismatchError):
        SkipUnreadable(DatasetMapper(_cfg(), is_train=False))(wrong_size)


@pytest.mark.parametrize("grouped", [False, True])
def test_an_unreadable_training_image_is_replaced_by_the_next_at_its_position(
    damaged_train, grouped
):
    # One epoch in dataset order; with (made-up) aspect-ratio groups by parity, the next
    # image of the same group is two indices on.
    n = len(damaged_train)
    groups = torch.arange(n).remainder(2).to(torch.uint8).numpy() if grouped else None
    step = 2 if grouped else 1
    sampler = ResumableTrainingSampler(n, shuffle=False, seed=0)
    mapper = SkipUnreadable(DatasetMapper(_cfg(), is_train=True))
    batches = TrainBatches(damaged_train, mapper, sampler, 4, groups=groups)
    images = [d for batch in itertools.islice(iter(batches), n // 4) for d in batch]

    positions = [p for batch in itertools.islice(batches.index_batches(), n // 4) for p, _ in batch]
    expected = [i + step if i in TRAIN_DAMAGE else i for i in positions]
    assert [d["file_name"] for d in images] == [damaged_train[i]["file_name"] for i in expected]
    assert [d["num_skipped"] for d in images] == [int(i in TRAIN_DAMAGE) for i in positions]


class PerfectDetector(nn.Module):
    """Predicts each image's ground-truth boxes (score 1), looked up by image id."""

    def __init__(self, dicts):
        super().__init__()
        self.annotations = {d["image_id"]: d["annotations"] for d in dicts}

    def forward(self, inputs):
        outputs = []
        for x in inputs:
            anns = self.annotations[x["image_id"]]
            boxes = [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS) for a in anns]
            instances = Instances((x["height"], x["width"]))
            instances.pred_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
            instances.scores = torch.ones(len(anns))
            instances.pred_classes = torch.tensor([a["category_id"] for a in anns])
            outputs.append({"instances": instances})
        return outputs


def test_evaluation_leaves_unreadable_images_out_and_counts_them(
    tiny_shapes, tmp_path, largedet_log
):
    dicts = damaged_copies(DatasetCatalog.get("tiny_shapes_val"), tmp_path / "images", VAL_DAMAGE)
    name = register("damaged_tiny_shapes_val", dicts, like="tiny_shapes_val")
    cfg = _cfg(tmp_path, "DATASETS.TEST", f"('{name}',)")
    model = PerfectDetector(dicts)

    loader = Trainer.build_test_loader(cfg, name)
    evaluator = Trainer.build_evaluator(cfg, name, str(tmp_path / "eval"))
    results = inference_on_dataset(model, loader, evaluator)

    assert loader.num_skipped == 3
    assert results["bbox"]["AP"] == pytest.approx(100.0)  # the 5 readable images, all found
    messages = [r.getMessage() for r in largedet_log.records]
    for i, kind in VAL_DAMAGE.items():
        assert any(dicts[i]["file_name"] in m and REASONS[kind] in m for m in messages)
    assert f"{name}: 3 unreadable images left out of the evaluation on this rank" in messages

    # Detectron2's evaluator would score the three as images without detections.
    reference = DetectronCOCOEvaluator(name, output_dir=str(tmp_path / "eval"))
    assert inference_on_dataset(model, loader, reference)["bbox"]["AP"] < 90.0


def test_an_image_over_the_pixel_limit_is_skipped_before_it_is_decoded(damaged_train, tmp_path, largedet_log):
    """DATALOADER.MAX_IMAGE_PIXELS (default PIL's own limit): a larger image is unreadable,
    read from its header; a decompression bomb is one at the default."""
    from unreadable_testing import decompression_bomb

    from largedet.data.unreadable import max_image_pixels

    cfg = _cfg()
    assert max_image_pixels(cfg) == 89_478_485
    bomb = dict(damaged_train[0], file_name=str(tmp_path / "bomb.png"))
    decompression_bomb(bomb["file_name"])
    mapper = SkipUnreadable(DatasetMapper(cfg, is_train=False), 10, max_image_pixels(cfg))
    assert mapper(bomb) is None and mapper(damaged_train[0]) is not None
    small = SkipUnreadable(DatasetMapper(cfg, is_train=False), 10, 64 * 64 - 1)
    assert small(damaged_train[0]) is None and small.num_skipped == 1
    messages = [r.getMessage() for r in largedet_log.records]
    assert "64x64 = 4096 pixels, over DATALOADER.MAX_IMAGE_PIXELS 4095" in messages[-1]
    assert bomb["file_name"] in messages[0] and "over DATALOADER.MAX_IMAGE_PIXELS 89478485" in messages[0]
