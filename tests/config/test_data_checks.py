"""The data checks before launch (largedet.config.validate): the model's classes against a
COCO json's categories, a sample of image sizes against the json, an image folder that is
not the json's. Each is one line and exit status 2 from tools/train_net.py, before any
worker starts or any model is built."""

import json
import os

import pytest
from PIL import Image

import launch_testing

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")  # 3 classes


def tiny_coco(folder, categories=3, sizes=((32, 24), (24, 32), (32, 32))):
    """Images of ``sizes`` (width, height) in ``folder/images`` and a json giving them, one box
    each, ``categories`` categories. Returns (json file, image folder)."""
    images = folder / "images"
    images.mkdir(parents=True)
    entries = []
    for i, (width, height) in enumerate(sizes, 1):
        Image.new("RGB", (width, height)).save(images / f"{i}.jpg")
        entries.append({"id": i, "file_name": f"{i}.jpg", "width": width, "height": height})
    data = {
        "images": entries,
        "annotations": [{"id": i, "image_id": i, "category_id": 1 + i % categories, "bbox": [2, 2, 8, 8],
                         "area": 64, "iscrowd": 0} for i in range(1, len(sizes) + 1)],  # fmt: skip
        "categories": [{"id": c, "name": f"c{c}"} for c in range(1, categories + 1)],
    }
    json_file = folder / "train.json"
    json_file.write_text(json.dumps(data))
    return json_file, images


def rejected(tmp_path, json_file, image_root, *opts):
    """tools/train_net.py on the demo config training on ``json_file``: its one error line
    (exit 2, no model, the shapes set not generated)."""
    env = dict(os.environ, LARGEDET_DATASETS=str(tmp_path / "ld"), OMP_NUM_THREADS="1")
    args = ["--config", CONFIG, "DATASETS.COCO_JSONS", f"[['mine', '{json_file}', '{image_root}']]",
            "DATASETS.TRAIN", "('mine',)", "DATASETS.TEST", "()", "OUTPUT_DIR", str(tmp_path / "out"), *opts]  # fmt: skip
    line = launch_testing.run_rejected(TRAIN_NET, args, env, [tmp_path / "ld", tmp_path / "out" / "log.txt"])
    return line


def test_fewer_classes_than_the_jsons_categories(tmp_path):
    json_file, images = tiny_coco(tmp_path)
    line = rejected(tmp_path, json_file, images, "MODEL.ROI_HEADS.NUM_CLASSES", "2")
    assert line == (
        f"error: MODEL.ROI_HEADS.NUM_CLASSES: 2, but {json_file} (dataset 'mine') has 3 categories, "
        "which the model could not tell apart; set MODEL.ROI_HEADS.NUM_CLASSES 3"
    )


def test_an_image_whose_size_is_not_the_jsons(tmp_path):
    json_file, images = tiny_coco(tmp_path)
    Image.new("RGB", (40, 32)).save(images / "3.jpg")  # the json says 32 x 32
    line = rejected(tmp_path, json_file, images)
    assert line == (
        f"error: {json_file}: images[2] '3.jpg' is 32x32 (width x height) there, but its file "
        f"{images / '3.jpg'} is 40x32 (dataset 'mine', DATASETS.TRAIN)"
    )


def test_an_image_folder_that_is_not_the_jsons(tmp_path):
    json_file, _ = tiny_coco(tmp_path)
    other = tmp_path / "other_images"
    other.mkdir()
    (other / "unrelated.jpg").write_bytes(b"")
    line = rejected(tmp_path, json_file, other)
    assert line == (
        f"error: {other}: none of the 3 images of {json_file} looked up there can be read (the first: "
        f"{other / '1.jpg'}: No such file or directory); is it this file's image folder? (dataset 'mine', "
        "DATASETS.TRAIN)"
    )


def test_check_num_classes_allows_more_classes_than_categories(tmp_path):
    from detectron2.data.datasets import register_coco_instances

    from largedet.config.validate import ConfigError
    from largedet.data.checks import check_num_classes

    json_file, images = tiny_coco(tmp_path, categories=2)
    register_coco_instances("data_checks_two_categories", {}, str(json_file), str(images))
    check_num_classes(["data_checks_two_categories"], "MODEL.ROI_HEADS.NUM_CLASSES", 3)
    check_num_classes(["data_checks_two_categories"], "MODEL.ROI_HEADS.NUM_CLASSES", 2)
    with pytest.raises(ConfigError, match=r"^MODEL.ROI_HEADS.NUM_CLASSES: 1, but .* has 2 categories"):
        check_num_classes(["data_checks_two_categories"], "MODEL.ROI_HEADS.NUM_CLASSES", 1)
