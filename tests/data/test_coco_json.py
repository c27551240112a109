"""A user's own COCO json: DATASETS.COCO_JSONS registers it, check_coco_json names what
Detectron2 would fail on, check_image_sizes compares a sample of its images with it, boxes
of negative size or zero area are left out of training with a count, and
tools/train_net.py trains and evaluates on it from the command line."""

import json
import logging
import os
import subprocess
import sys

import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

from largedet.config import add_largedet_config
from largedet.data import (
    CocoJsonError,
    ShapesSpec,
    build_train_loader,
    check_coco_json,
    check_image_sizes,
    coco_jsons_from_config,
    drop_unusable_boxes,
    generate_shapes,
    register_coco_jsons,
)
from largedet.data.coco_json import IMAGE_SAMPLE, CocoImage, CocoJson, DroppedBoxes
from PIL import Image

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


@pytest.fixture(scope="module")
def user_coco(tmp_path_factory):
    """A user's COCO dataset made with the shapes generator (12 train / 4 val images, 64 px)
    under their own file names, with the first training box's width made negative and the
    second's height 0. Returns (train json, train images, val json, val images, the negative
    box's id)."""
    root = tmp_path_factory.mktemp("user")
    spec = ShapesSpec(num_train=12, num_val=4, image_size=64, seed=11, root=str(root / "generated"))
    generate_shapes(spec)
    with open(spec.json_file("train")) as f:
        train = json.load(f)
    bad = train["annotations"][0]
    bad["bbox"][2] = -bad["bbox"][2]
    train["annotations"][1]["bbox"][3] = 0  # and the second's height 0
    train_json, val_json = root / "my_train.json", root / "my_val.json"
    train_json.write_text(json.dumps(train))
    val_json.write_text(open(spec.json_file("val")).read())
    return str(train_json), spec.image_root("train"), str(val_json), spec.image_root("val"), bad["id"]


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


GOOD = {
    "images": [{"id": 1, "file_name": "a.jpg", "height": 10, "width": 10}],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 2, "bbox": [0, 0, 5, 5], "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 1, "bbox": [5, 5, -2, 3], "iscrowd": 0},
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [5, 5, 2, -3], "iscrowd": 0},
    ],
    "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
}


def test_check_coco_json_counts_what_it_read(tmp_path):
    data = json.loads(json.dumps(GOOD))
    data["annotations"].append({"id": 4, "image_id": 1, "category_id": 1, "bbox": [1, 1, 0, 3]})
    summary = check_coco_json(write(tmp_path / "a.json", data))
    assert (summary.images, summary.annotations, summary.categories) == (1, 4, 2)
    assert (summary.negative_boxes, summary.zero_area_boxes) == (2, 1)
    assert summary.sample == (CocoImage(0, "a.jpg", 10, 10),)


def test_the_image_sample_spreads_over_the_file(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 4, "height": 3} for i in range(20)]
    images[0].pop("width")  # no size given: Detectron2 checks none, nor does the sample
    data = dict(GOOD, images=images, annotations=[])
    sample = check_coco_json(write(tmp_path / "a.json", data)).sample
    assert len(sample) == IMAGE_SAMPLE
    # positions round(k * 18 / 7) of the 19 sized images, which start at index 1
    assert [im.index for im in sample] == [1, 4, 6, 9, 11, 14, 16, 19]


def image(path, width, height, orientation=None):
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.new("RGB", (width, height)).save(path, exif=exif)


def test_check_image_sizes(tmp_path):
    image(tmp_path / "a.jpg", 20, 12)
    image(tmp_path / "b.jpg", 20, 12, orientation=6)  # shown turned: 12 x 20, as read_image reads it
    sample = (CocoImage(0, "a.jpg", 20, 12), CocoImage(3, "b.jpg", 12, 20), CocoImage(5, "gone.jpg", 1, 1))
    check_image_sizes("x.json", str(tmp_path), sample)  # one missing image: training passes over it

    wrong = sample + (CocoImage(7, "a.jpg", 12, 20),)
    with pytest.raises(CocoJsonError) as e:
        check_image_sizes("x.json", str(tmp_path), wrong)
    assert str(e.value) == (
        f"x.json: images[7] 'a.jpg' is 12x20 (width x height) there, but its file "
        f"{tmp_path / 'a.jpg'} is 20x12"
    )

    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(CocoJsonError) as e:
        check_image_sizes("x.json", str(other), sample)
    assert str(e.value) == (
        f"{other}: none of the 3 images of x.json looked up there can be read (the first: "
        f"{other / 'a.jpg'}: No such file or directory); is it this file's image folder?"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["annotations"][1].update(category_id=3),
         "annotations[1] (id 2, image 1): category_id 3 is not among the ids of 'categories' (1, 2)"),
        (lambda d: d["annotations"][0].update(bbox=[0, 0, 5]),
         "annotations[0] (id 1, image 1): bbox must be [x, y, width, height], got [0, 0, 5]"),
        (lambda d: d["images"][0].pop("file_name"), "images[0] has no 'file_name'"),
        (lambda d: d["categories"][1].pop("id"), "categories[1] has no 'id'"),
        (lambda d: d.pop("categories"), "no 'categories' list: not a COCO annotation file"),
        (lambda d: d["images"].extend([dict(d["images"][0], file_name="b.jpg"), dict(d["images"][0], file_name="c.jpg")]),
         "images[1] has the id 1 of images[0] (1 more entries repeat an id): annotations would attach to the wrong image"),
        (lambda d: d["annotations"][2].update(id=1),
         "annotations[2] has the id 1 of annotations[0]: ids must be unique"),
        (lambda d: d["images"][0].update(file_name="../../etc/a.jpg"),
         "images[0] file_name '../../etc/a.jpg' is outside the image folder: give a path relative to it "
         "(image_root), without .. out of it"),
        (lambda d: d["images"][0].update(file_name="/data/a.jpg"),
         "images[0] file_name '/data/a.jpg' is outside the image folder: give a path relative to it "
         "(image_root), without .. out of it"),
    ],
)  # fmt: skip
def test_check_coco_json_names_the_file_and_entry(tmp_path, change, message):
    data = json.loads(json.dumps(GOOD))
    change(data)
    path = write(tmp_path / "a.json", data)
    with pytest.raises(CocoJsonError) as e:
        check_coco_json(path)
    assert str(e.value) == f"{path}: {message}"


def test_truncated_json(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(GOOD)[:100])  # cut inside the first annotation
    with pytest.raises(json.JSONDecodeError) as parsed:
        json.loads(path.read_text())
    with pytest.raises(CocoJsonError) as e:
        check_coco_json(str(path))
    err = parsed.value
    assert str(e.value) == (
        f"{path}: not valid JSON ({err.msg} at line 1 column {err.colno}); a file cut short by an "
        "interrupted copy or download reads so"
    )


def test_drop_unusable_boxes_in_both_box_modes():
    dicts = [
        {"annotations": [{"bbox": [0, 0, 5, 5], "bbox_mode": BoxMode.XYWH_ABS},
                         {"bbox": [0, 0, -1, 5], "bbox_mode": BoxMode.XYWH_ABS},
                         {"bbox": [4, 4, 2, 9], "bbox_mode": BoxMode.XYXY_ABS},
                         {"bbox": [4, 4, 4, 9], "bbox_mode": BoxMode.XYXY_ABS}]},
        {"annotations": [{"bbox": [0, 0, 0, 0], "bbox_mode": BoxMode.XYWH_ABS},
                         {"bbox": [1, 1, 3, 0], "bbox_mode": BoxMode.XYWH_ABS},
                         {"bbox": [1, 1, 3, 2], "bbox_mode": BoxMode.XYWH_ABS}]},
        {},
    ]  # fmt: skip
    assert drop_unusable_boxes(dicts) == DroppedBoxes(negative=2, zero_area=3)
    assert [a["bbox"] for a in dicts[0]["annotations"]] == [[0, 0, 5, 5]]
    assert [a["bbox"] for a in dicts[1]["annotations"]] == [[1, 1, 3, 2]]


def test_boxes_outside_their_image_are_clipped_or_left_out_and_counted():
    dicts = [
        {"width": 10, "height": 8, "annotations": [
            {"bbox": [2, 2, 3, 3], "bbox_mode": BoxMode.XYWH_ABS},  # inside: as it is
            {"bbox": [-2, 1, 5, 20], "bbox_mode": BoxMode.XYWH_ABS},  # partly outside
            {"bbox": [8, 6, 12, 9], "bbox_mode": BoxMode.XYXY_ABS},  # partly outside
            {"bbox": [11, 0, 4, 4], "bbox_mode": BoxMode.XYWH_ABS},  # wholly outside
        ]},
        {"annotations": [{"bbox": [-5, -5, 100, 100], "bbox_mode": BoxMode.XYWH_ABS}]},  # no size: kept
    ]  # fmt: skip
    assert drop_unusable_boxes(dicts) == DroppedBoxes(negative=0, zero_area=0, outside=1, clipped=2)
    assert [a["bbox"] for a in dicts[0]["annotations"]] == [[2, 2, 3, 3], [0, 1, 3, 7], [8, 6, 10, 8]]
    assert [a["bbox"] for a in dicts[1]["annotations"]] == [[-5, -5, 100, 100]]


def test_coco_jsons_entries_and_registration(tmp_path):
    cfg = add_largedet_config(get_cfg())
    cfg.DATASETS.COCO_JSONS = [["mine_a", "~/a.json", str(tmp_path)]]
    (entry,) = coco_jsons_from_config(cfg)
    assert entry == CocoJson("mine_a", os.path.expanduser("~/a.json"), str(tmp_path))
    register_coco_jsons([entry])
    register_coco_jsons([entry])  # registering again replaces
    meta = MetadataCatalog.get("mine_a")
    assert (meta.json_file, meta.image_root, meta.evaluator_type) == (entry.json_file, str(tmp_path), "coco")
    cfg.DATASETS.COCO_JSONS = [["mine_a", "a.json", "x"], ["mine_a", "b.json", "y"]]
    with pytest.raises(CocoJsonError, match=r"^DATASETS.COCO_JSONS\[1\]: dataset 'mine_a' is given twice$"):
        coco_jsons_from_config(cfg)
    with pytest.raises(CocoJsonError, match="'coco_2017_val' is already registered"):
        register_coco_jsons([CocoJson("coco_2017_val", "a.json", "x")])
    assert "coco_2017_val" in DatasetCatalog.list()


def test_negative_and_zero_area_boxes_are_not_trained_on(user_coco, tmp_path):
    train_json, train_root, _, _, bad_id = user_coco
    register_coco_jsons([CocoJson("user_train_unit", train_json, train_root)])
    cfg = add_largedet_config(get_cfg())
    cfg.DATASETS.TRAIN = ("user_train_unit",)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.MODEL.DEVICE = "cpu"
    # caught on the module's own logger: Detectron2's setup_logger (other tests) stops the
    # "largedet" logger from propagating to pytest's
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    log = logging.getLogger("largedet.data.build")
    log.addHandler(handler)
    try:
        loader = build_train_loader(cfg, 2)
    finally:
        log.removeHandler(handler)
    dicts = loader.loader.dataset.dataset
    loaded = [tuple(a["bbox"]) for i in range(len(dicts)) for a in dicts[i]["annotations"]]
    with open(train_json) as f:
        written = {a["id"]: tuple(a["bbox"]) for a in json.load(f)["annotations"]}
    (flat_id,) = [i for i, box in written.items() if box[3] == 0]
    assert sorted(loaded) == sorted(box for i, box in written.items() if i not in (bad_id, flat_id))
    assert written[bad_id][2] < 0
    assert "user_train_unit: 1 box(es) of negative width or height left out of training" in messages
    assert "user_train_unit: 1 box(es) of zero area left out of training" in messages


def test_train_on_a_users_coco_json_from_the_command_line(user_coco, tmp_path):
    train_json, train_root, val_json, val_root, _ = user_coco
    out_dir = tmp_path / "run"
    overrides = [
        "DATASETS.COCO_JSONS", f"[['my_train', '{train_json}', '{train_root}'], ['my_val', '{val_json}', '{val_root}']]",
        "DATASETS.TRAIN", "('my_train',)", "DATASETS.TEST", "('my_val',)",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "64",
        "INPUT.MAX_SIZE_TEST", "64", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "3",
        "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "(2,)", "SOLVER.CHECKPOINT_PERIOD", "3",
        "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ, LARGEDET_DATASETS=str(tmp_path / "ld"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *overrides],
                          capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out_dir / "log.txt").read_text()
    # the config's MODEL.DEVICE auto, on this machine without a GPU: a line in the console and in log.txt
    device_line = "MODEL.DEVICE auto: no CUDA device found, running on the CPU"
    assert device_line in proc.stderr + proc.stdout and device_line in log
    assert "my_train: 1 box(es) of negative width or height left out of training" in log
    assert "my_train: 1 box(es) of zero area left out of training" in log
    assert (out_dir / "model_final.pth").is_file()
    results = json.loads((out_dir / "inference" / "coco_instances_results.json").read_text())
    with open(val_json) as f:
        val_ids = {im["id"] for im in json.load(f)["images"]}
    assert results and {r["image_id"] for r in results} <= val_ids
    assert [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")]
    assert not (tmp_path / "ld").exists()  # the built-in shapes set was neither needed nor generated


def test_an_oversized_image_in_the_sample_counts_as_unreadable(tmp_path):
    """A decompression bomb (or an image over DATALOADER.MAX_IMAGE_PIXELS) among the images
    checked before launch is passed over as an unreadable one, not a traceback."""
    from unreadable_testing import decompression_bomb

    image(tmp_path / "a.jpg", 10, 10)
    decompression_bomb(str(tmp_path / "b.png"))
    sample = (CocoImage(0, "a.jpg", 10, 10), CocoImage(1, "b.png", 20000, 20000))
    check_image_sizes("x.json", str(tmp_path), sample)
    check_image_sizes("x.json", str(tmp_path), sample, max_pixels=100)
    with pytest.raises(CocoJsonError, match=r"a\.jpg: 10x10 = 100 pixels, over DATALOADER\.MAX_IMAGE_PIXELS 99"):
        check_image_sizes("x.json", str(tmp_path), sample, max_pixels=99)  # none is left
