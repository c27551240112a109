"""The built-in shapes dataset: valid COCO annotations, real files, deterministic bytes."""

import hashlib
import os

import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest
from pycocotools.coco import COCO

from largedet.data import SHAPES_CLASSES, ShapesSpec, generate_shapes, register_shapes


def _digest(folder):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            with open(os.path.join(root, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


def test_annotations_load_in_pycocotools_and_match_the_images(tiny_shapes):
    for split, count in (("train", tiny_shapes.num_train), ("val", tiny_shapes.num_val)):
        coco = COCO(tiny_shapes.json_file(split))
        assert len(coco.getImgIds()) == count
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(SHAPES_CLASSES)
        assert len(coco.getAnnIds()) >= count  # at least one visible shape per image on average
        for ann in coco.loadAnns(coco.getAnnIds()):
            img = coco.loadImgs(ann["image_id"])[0]
            x, y, w, h = ann["bbox"]
            assert 0 <= x and 0 <= y and x + w <= img["width"] and y + h <= img["height"] and w > 0 and h > 0
            mask = coco.annToMask(ann)
            assert mask.shape == (img["height"], img["width"])
            # the box is the visible mask's bounding box, the area its pixel count
            ys, xs = np.nonzero(mask)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)
            assert mask.sum() == ann["area"]


def test_images_are_readable_jpegs_of_the_stated_size(tiny_shapes):
    coco = COCO(tiny_shapes.json_file("val"))
    for img in coco.loadImgs(coco.getImgIds()):
        path = os.path.join(tiny_shapes.image_root("val"), img["file_name"])
        with open(path, "rb") as f:
            assert f.read(3) == b"\xff\xd8\xff"  # JPEG magic
        image = cv2.imread(path)
        assert image.shape == (img["height"], img["width"], 3)


def test_visible_masks_do_not_overlap(tiny_shapes):
    """Masks are the visible parts: two instances never claim the same pixel."""
    coco = COCO(tiny_shapes.json_file("train"))
    for image_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
        if len(anns) > 1:
            stacked = np.stack([coco.annToMask(a) for a in anns]).astype(int)
            assert stacked.sum(axis=0).max() == 1


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = generate_shapes(ShapesSpec(num_train=6, num_val=2, image_size=48, seed=7, root=str(tmp_path / "a")))
    b = generate_shapes(ShapesSpec(num_train=6, num_val=2, image_size=48, seed=7, root=str(tmp_path / "b")))
    c = generate_shapes(ShapesSpec(num_train=6, num_val=2, image_size=48, seed=8, root=str(tmp_path / "c")))
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_generation_is_cached(tmp_path):
    spec = ShapesSpec(num_train=3, num_val=2, image_size=48, root=str(tmp_path))
    folder = generate_shapes(spec)
    stamp = os.path.getmtime(spec.json_file("train"))
    assert generate_shapes(spec) == folder
    assert os.path.getmtime(spec.json_file("train")) == stamp
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []


def test_registered_in_detectron2_catalogs(tiny_shapes):
    from detectron2.data import DatasetCatalog, MetadataCatalog

    dicts = DatasetCatalog.get("tiny_shapes_val")
    assert len(dicts) == tiny_shapes.num_val
    assert MetadataCatalog.get("tiny_shapes_val").thing_classes == list(SHAPES_CLASSES)
    record = dicts[0]
    assert os.path.isfile(record["file_name"])
    ann = record["annotations"][0]
    assert ann["category_id"] in range(len(SHAPES_CLASSES))  # contiguous ids
    assert mask_util.area(ann["segmentation"]) > 0


@pytest.mark.parametrize("key,value", [("num_train", 0), ("num_val", -1), ("image_size", 8)])
def test_bad_sizes_are_rejected(key, value):
    with pytest.raises(ValueError, match=key):
        ShapesSpec(**{key: value})


@pytest.mark.parametrize("holdout_seed", [1000, -1])
def test_config_registers_a_held_out_copy_of_another_seed(tmp_path, holdout_seed):
    import argparse

    from detectron2.data import DatasetCatalog, MetadataCatalog

    from largedet.engine.defaults import setup_cfg

    for name in ("shapes_holdout_train", "shapes_holdout_val"):
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
    args = argparse.Namespace(config_file="", opts=[
        "DATASETS.SHAPES.ROOT", str(tmp_path), "DATASETS.SHAPES.NUM_TRAIN", "3",
        "DATASETS.SHAPES.NUM_VAL", "2", "DATASETS.SHAPES.IMAGE_SIZE", "32",
        "DATASETS.SHAPES.HOLDOUT_SEED", str(holdout_seed), "MODEL.DEVICE", "cpu",
    ])  # fmt: skip
    setup_cfg(args, log=False)
    if holdout_seed < 0:
        assert "shapes_holdout_val" not in DatasetCatalog.list()
        return
    spec = MetadataCatalog.get("shapes_holdout_val").shapes_spec
    assert spec == ShapesSpec(num_train=3, num_val=2, image_size=32, seed=1000, root=str(tmp_path))
    held_out = DatasetCatalog.get("shapes_holdout_val")
    reported = DatasetCatalog.get("shapes_val")
    assert len(held_out) == 2
    # other images than the reported split's
    with open(held_out[0]["file_name"], "rb") as a, open(reported[0]["file_name"], "rb") as b:
        assert a.read() != b.read()
