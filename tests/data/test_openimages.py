"""OpenImages: parsing the official files, their errors, the cache, registration, training."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog, build_detection_train_loader
from detectron2.engine import SimpleTrainer
from detectron2.modeling import build_model
from detectron2.structures import BoxMode

import largedet.data.openimages as oi
import largedet.data.openimages.annotations as oi_annotations
import largedet.data.openimages.csv_reader as oi_csv_reader
from largedet.config import add_largedet_config
from largedet.data.openimages import (
    ClassHierarchy,
    OpenImagesFormatError,
    load_hierarchy,
    load_openimages_annotations,
    parse_openimages_annotations,
    read_class_descriptions,
    register_all_openimages,
    register_openimages,
)
from largedet.data.openimages.fixture import (
    FIXTURE_CLASSES,
    register_openimages_fixture,
    write_openimages_fixture,
)

HEADER = "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax,IsOccluded,IsTruncated,IsGroupOf,IsDepiction,IsInside\n"
CLASSES = '/m/animal,Animal\n/m/dog,Dog\n/m/cat,"Cat, domestic"\n/m/car,Car\n'
# Entity (root) -> Animal -> {Dog, Cat}; Entity -> Vehicle (not a class) -> Car.
HIERARCHY = {
    "LabelName": "/m/0bl9f",
    "Subcategory": [
        {
            "LabelName": "/m/animal",
            "Subcategory": [{"LabelName": "/m/dog"}, {"LabelName": "/m/cat"}],
        },
        {"LabelName": "/m/vehicle", "Subcategory": [{"LabelName": "/m/car"}]},
    ],
}
# Rows out of ImageID order on purpose (img_b's rows come first).
BOXES = HEADER + (
    "img_b,xclick,/m/car,1,0.5,1.0,0.25,0.75,0,1,0,0,0\n"
    "img_a,xclick,/m/dog,1,0.1,0.5,0.2,0.6,1,0,0,0,0\n"
    "img_a,activemil,/m/cat,1,0.0,1.0,0.0,0.5,0,0,1,1,0\n"
)
LABELS = "ImageID,Source,LabelName,Confidence\nimg_a,verification,/m/dog,1\nimg_c,verification,/m/car,0\n"


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.fixture
def files(tmp_path):
    return {
        "boxes": write(tmp_path / "boxes.csv", BOXES),
        "classes": write(tmp_path / "classes.csv", CLASSES),
        "labels": write(tmp_path / "labels.csv", LABELS),
        "hierarchy": write(tmp_path / "hierarchy.json", json.dumps(HIERARCHY)),
    }


def test_parse_arrays(files):
    ann = parse_openimages_annotations(files["boxes"], files["classes"], files["labels"])
    assert ann.label_names == ("/m/animal", "/m/dog", "/m/cat", "/m/car")
    assert ann.display_names[2] == "Cat, domestic"
    # The union of the images of both files, sorted.
    assert ann.image_ids.tolist() == [b"img_a", b"img_b", b"img_c"]
    assert ann.box_offsets.tolist() == [0, 2, 3, 3]
    # Stored as XMin, YMin, XMax, YMax (the file's order is XMin, XMax, YMin, YMax).
    np.testing.assert_allclose(
        ann.boxes, [[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 0.5], [0.5, 0.25, 1.0, 0.75]]
    )
    assert ann.box_labels.tolist() == [1, 2, 3]
    assert ann.box_flags.tolist() == [[1, 0, 0, 0, 0], [0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]
    assert ann.box_is_group_of.tolist() == [False, True, False]
    assert ann.label_offsets.tolist() == [0, 1, 1, 2]
    assert ann.label_classes.tolist() == [1, 3]
    assert ann.label_confidence.tolist() == [1, 0]
    assert ann.image_index(["img_c", b"img_a", "nope"]).tolist() == [2, 0, -1]


def test_parse_variants_give_the_same_arrays(tmp_path, files):
    """Any column order, extra columns, absent optional flags, CRLF, quotes, blank lines."""
    ref = parse_openimages_annotations(files["boxes"], files["classes"])
    text = (
        "XMax,ImageID,LabelName,XMin,YMin,YMax,IsGroupOf,XClick1X,IsOccluded,IsTruncated,IsDepiction,IsInside\r\n"
        "1.0,img_b,/m/car,0.5,0.25,0.75,0,-1,0,1,0,0\r\n"
        "\r\n"
        '0.5,"img_a",/m/dog,0.1,0.2,0.6,0,0.3,1,0,0,0\r\n'
        "1.0,img_a,/m/cat,0.0,0.0,0.5,1,0.2,0,0,1,0"
    )
    other = parse_openimages_annotations(write(tmp_path / "b2.csv", text), files["classes"])
    for name in ("image_ids", "box_offsets", "boxes", "box_labels", "box_flags"):
        np.testing.assert_array_equal(getattr(other, name), getattr(ref, name))
    # Without the optional flag columns: -1 (unknown), IsGroupOf kept.
    text = "ImageID,LabelName,XMin,XMax,YMin,YMax,IsGroupOf\nimg_a,/m/cat,0,1,0,0.5,1\n"
    minimal = parse_openimages_annotations(write(tmp_path / "b3.csv", text), files["classes"])
    assert minimal.box_flags.tolist() == [[-1, -1, 1, -1, -1]]


BAD_BOXES = [
    # (file text, line, column, words in the message)
    (HEADER.replace(",IsGroupOf", ""), 1, "IsGroupOf", "missing column"),
    (HEADER.replace("XMin,", ""), 1, "XMin", "missing column"),
    (HEADER + "img_a,xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0\n", 2, None, "expected 13 fields"),
    (
        HEADER
        + "img_a,xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0,0\nimg_a,xclick,/m/bird,1,0.1,0.5,0.2,0.6,0,0,0,0,0\n",
        3,
        "LabelName",
        "unknown LabelName",
    ),
    (
        HEADER + "img_a,xclick,/m/dog,1,0.1,abc,0.2,0.6,0,0,0,0,0\n",
        2,
        "XMax",
        "expected a number, found 'abc'",
    ),
    (HEADER + "img_a,xclick,/m/dog,1,0.1,0.5,0.2,,0,0,0,0,0\n", 2, "YMax", "expected a number"),
    (HEADER + "img_a,xclick,/m/dog,1,0.1,0.5,0.2,nan,0,0,0,0,0\n", 2, "YMax", "expected a number"),
    (HEADER + "img_a,xclick,/m/dog,1,0.1,1.5,0.2,0.6,0,0,0,0,0\n", 2, "XMax", "outside [0, 1]"),
    (HEADER + "img_a,xclick,/m/dog,1,-0.1,0.5,0.2,0.6,0,0,0,0,0\n", 2, "XMin", "outside [0, 1]"),
    (
        HEADER + "img_a,xclick,/m/dog,1,0.6,0.5,0.2,0.6,0,0,0,0,0\n",
        2,
        "XMin",
        "XMin = 0.6 is greater than XMax = 0.5",
    ),
    (HEADER + "img_a,xclick,/m/dog,1,0.1,0.5,0.7,0.6,0,0,0,0,0\n", 2, "YMin", "greater than YMax"),
    (
        HEADER + "img_a,xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,2,0,0\n",
        2,
        "IsGroupOf",
        "expected 0, 1 or -1",
    ),
    (HEADER + ",xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0,0\n", 2, "ImageID", "empty ImageID"),
    ("", 1, None, "empty file"),
]


@pytest.mark.parametrize("text,line,column,words", BAD_BOXES)
def test_box_file_errors_name_file_line_and_column(tmp_path, files, text, line, column, words):
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(OpenImagesFormatError) as info:
        parse_openimages_annotations(path, files["classes"])
    err = info.value
    assert (err.path, err.line, err.column) == (path, line, column)
    assert words in str(err) and str(err).startswith(f"{path}, line {line}")


def test_error_line_numbers_across_chunks(tmp_path, files, monkeypatch):
    monkeypatch.setattr(oi_csv_reader, "_CHUNK_BYTES", 100)  # a few lines per chunk
    rows = ["img_a,xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0,0\n"] * 30
    rows[22] = rows[22].replace("/m/dog", "/m/bird")
    path = write(tmp_path / "bad.csv", HEADER + "".join(rows))
    with pytest.raises(OpenImagesFormatError, match=r"line 24, column 'LabelName'"):
        parse_openimages_annotations(path, files["classes"])
    rows[22] = '"img_a",xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0\n'  # the csv-module path
    path = write(tmp_path / "bad2.csv", HEADER + "".join(rows))
    with pytest.raises(OpenImagesFormatError, match=r"line 24: expected 13 fields"):
        parse_openimages_annotations(path, files["classes"])


def test_other_file_errors(tmp_path, files):
    with pytest.raises(
        OpenImagesFormatError,
        match=r"labels.csv, line 3, column 'Confidence': expected 0 .* found 0.5",
    ):
        parse_openimages_annotations(
            files["boxes"],
            files["classes"],
            write(
                tmp_path / "labels.csv",
                "ImageID,Source,LabelName,Confidence\na,s,/m/dog,1\nb,s,/m/dog,0.5\n",
            ),
        )
    with pytest.raises(
        OpenImagesFormatError, match=r"l2.csv, line 1, column 'Confidence': missing column"
    ):
        parse_openimages_annotations(
            files["boxes"],
            files["classes"],
            write(tmp_path / "l2.csv", "ImageID,Source,LabelName\n"),
        )
    with pytest.raises(
        OpenImagesFormatError,
        match=r"c.csv, line 3, column 'LabelName': '/m/a' already defined on line 1",
    ):
        read_class_descriptions(write(tmp_path / "c.csv", "/m/a,A\n/m/b,B\n/m/a,C\n"))
    with pytest.raises(OpenImagesFormatError, match=r"c2.csv, line 2: expected 2 fields"):
        read_class_descriptions(write(tmp_path / "c2.csv", "/m/a,A\n/m/b\n"))
    assert read_class_descriptions(
        write(tmp_path / "c3.csv", "LabelName,DisplayName\n/m/a,A\n")
    ) == (["/m/a"], ["A"])
    bad_tree = {
        "LabelName": "/m/0bl9f",
        "Subcategory": [{"LabelName": "/m/dog", "Subcategory": {"LabelName": "/m/cat"}}],
    }
    with pytest.raises(
        OpenImagesFormatError,
        match=r"h.json: 'Subcategory' of '/m/dog' at \$.Subcategory\[0\] is not a list",
    ):
        load_hierarchy(write(tmp_path / "h.json", json.dumps(bad_tree)), ["/m/dog"])
    with pytest.raises(OpenImagesFormatError, match=r"h2.json, line 1: invalid JSON"):
        load_hierarchy(write(tmp_path / "h2.json", "{"), ["/m/dog"])
    with pytest.raises(OpenImagesFormatError, match="cycle"):
        ClassHierarchy(["/m/a", "/m/b"], {"/m/a": ["/m/b"], "/m/b": ["/m/a"]})


def test_hierarchy(files):
    names = ["/m/animal", "/m/dog", "/m/cat", "/m/car", "/m/puppy"]
    tree = json.loads(json.dumps(HIERARCHY))
    # Puppy under Dog, and again directly under Animal (a second parent).
    tree["Subcategory"][0]["Subcategory"][0]["Subcategory"] = [{"LabelName": "/m/puppy"}]
    tree["Subcategory"][0]["Subcategory"].append({"LabelName": "/m/puppy"})
    h = ClassHierarchy.from_json_tree(tree, names)
    assert h.ancestors(4).tolist() == [0, 1]  # Animal, Dog (root and duplicates left out)
    assert h.ancestors(3).tolist() == []  # Vehicle is not a class; the root never counts
    assert h.descendants(0).tolist() == [1, 2, 4]
    rows, labels = h.expand_up(np.array([4, 3, 1]))
    assert rows.tolist() == [0, 0, 0, 1, 2, 2] and labels.tolist() == [4, 0, 1, 3, 1, 0]
    rows, labels = h.expand_down(np.array([0]))
    assert rows.tolist() == [0, 0, 0, 0] and labels.tolist() == [0, 1, 2, 4]
    # Through a node outside the vocabulary: Car's ancestor Vehicle becomes a class here.
    h2 = load_hierarchy(files["hierarchy"], ["/m/vehicle", "/m/car"])
    assert h2.ancestors(1).tolist() == [0]


def test_cache_is_reused_and_invalidated(tmp_path, files, monkeypatch):
    cache = str(tmp_path / "cache")
    first = load_openimages_annotations(
        files["boxes"], files["classes"], files["labels"], cache_dir=cache
    )
    calls = []
    real = oi.parse_openimages_annotations
    monkeypatch.setattr(
        oi_annotations, "parse_openimages_annotations", lambda *a: calls.append(a) or real(*a)
    )
    second = load_openimages_annotations(
        files["boxes"], files["classes"], files["labels"], cache_dir=cache
    )
    assert calls == []  # not parsed again
    assert isinstance(second.boxes, np.memmap)
    for name in oi.OpenImagesAnnotations._ARRAYS:
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))
    assert second.label_names == first.label_names and second.display_names == first.display_names
    # A changed file (size and modification time) is parsed again.
    with open(files["boxes"], "a") as f:
        f.write("img_d,xclick,/m/dog,1,0.1,0.5,0.2,0.6,0,0,0,0,0\n")
    third = load_openimages_annotations(
        files["boxes"], files["classes"], files["labels"], cache_dir=cache
    )
    assert len(calls) == 1 and len(third.boxes) == 4
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_openimages_annotations(str(tmp_path / "nope.csv"), files["classes"], cache_dir=cache)


def test_register_and_dataset_dicts(tmp_path, files):
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (200, 100)).save(images / "img_a.jpg")
    # img_b is stored 100 wide, 80 high, with EXIF orientation 6 (rotate 90):
    # Detectron2 reads it as 80 wide, 100 high.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (100, 80)).save(images / "img_b.jpg", exif=exif)
    Image.new("RGB", (50, 50)).save(images / "img_c.jpg")
    subset = write(tmp_path / "subset.csv", "/m/car,Car\n/m/animal,Animal\n/m/dog,Dog\n")
    cache = str(tmp_path / "cache")

    register_openimages(
        "oi_test_all",
        files["boxes"],
        str(images),
        files["classes"],
        files["labels"],
        files["hierarchy"],
        cache_dir=cache,
    )
    assert MetadataCatalog.get("oi_test_all").thing_classes == [
        "Animal",
        "Dog",
        "Cat, domestic",
        "Car",
    ]
    assert MetadataCatalog.get("oi_test_all").evaluator_type == "openimages"
    ds = DatasetCatalog.get("oi_test_all")
    assert len(ds) == 3
    a, b, c = ds
    assert (a["image_id"], a["width"], a["height"]) == ("img_a", 200, 100)
    assert a["file_name"] == str(images / "img_a.jpg")
    assert a["annotations"] == [
        {
            "bbox": pytest.approx([20, 20, 100, 60]),
            "bbox_mode": BoxMode.XYXY_ABS,
            "category_id": 1,
            "is_group_of": False,
        },
        {
            "bbox": pytest.approx([0, 0, 200, 50]),
            "bbox_mode": BoxMode.XYXY_ABS,
            "category_id": 2,
            "is_group_of": True,
        },
    ]
    assert (b["width"], b["height"]) == (80, 100)
    assert b["annotations"][0]["bbox"] == pytest.approx([40, 25, 80, 75])
    assert c["annotations"] == []  # only an image-level label

    # A class subset (contiguous ids in the subset's order), hierarchy expansion and
    # filtering of images without boxes.
    register_openimages(
        "oi_test_sub",
        files["boxes"],
        str(images),
        files["classes"],
        files["labels"],
        files["hierarchy"],
        class_subset_csv=subset,
        expand_hierarchy=True,
        filter_empty=True,
        cache_dir=cache,
    )
    assert MetadataCatalog.get("oi_test_sub").thing_classes == ["Car", "Animal", "Dog"]
    assert MetadataCatalog.get("oi_test_sub").label_names == ["/m/car", "/m/animal", "/m/dog"]
    ds = DatasetCatalog.get("oi_test_sub")
    assert [d["image_id"] for d in ds] == ["img_a", "img_b"]
    anns = ds[0]["annotations"]
    # Dog box -> Dog (2) and its Animal copy (1); the group-of Cat box -> Animal only.
    assert [(x["category_id"], x["is_group_of"]) for x in anns] == [
        (2, False),
        (1, False),
        (1, True),
    ]
    assert anns[0]["bbox"] == anns[1]["bbox"]
    assert [x["category_id"] for x in ds[1]["annotations"]] == [0]
    with pytest.raises(IndexError):
        ds[2]

    # Registering a name again replaces it.
    register_openimages(
        "oi_test_sub", files["boxes"], str(images), files["classes"], cache_dir=cache
    )
    assert len(DatasetCatalog.get("oi_test_sub")) == 2
    DatasetCatalog.remove("oi_test_all")
    DatasetCatalog.remove("oi_test_sub")


def test_missing_image_is_an_error(tmp_path, files):
    register_openimages(
        "oi_test_missing",
        files["boxes"],
        str(tmp_path / "none"),
        files["classes"],
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(FileNotFoundError, match="img_a.jpg"):
        DatasetCatalog.get("oi_test_missing")
    DatasetCatalog.remove("oi_test_missing")


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("oi_fixture"))
    write_openimages_fixture(root, num_train=12, num_val=6)
    return root


def test_builtin_names_on_the_official_layout(fixture_root, tmp_path, monkeypatch):
    monkeypatch.setenv("LARGEDET_CACHE", str(tmp_path / "cache"))
    names = register_all_openimages(fixture_root)
    assert "openimages_v6_train" in names and "openimages_v6_challenge500_val" in names
    assert len(MetadataCatalog.get("openimages_v6_val").thing_classes) == len(FIXTURE_CLASSES)
    assert MetadataCatalog.get("openimages_v6_challenge500_val").thing_classes == [
        "Shape",
        "Round",
        "Circle",
        "Square",
    ]
    train = DatasetCatalog.get("openimages_v6_train")
    val = DatasetCatalog.get("openimages_v6_val")
    assert len(val) == 6 and 0 < len(train) <= 12
    group_of = [a["is_group_of"] for d in train for a in d["annotations"]]
    assert any(group_of) and not all(group_of)
    for d in val:
        image = Image.open(d["file_name"])
        assert image.size == (d["width"], d["height"])
        for a in d["annotations"]:
            x0, y0, x1, y1 = a["bbox"]
            assert 0 <= x0 < x1 <= d["width"] and 0 <= y0 < y1 <= d["height"]
    # Re-registering with the default root (from $LARGEDET_DATASETS) is lazy: no file needed.
    monkeypatch.setenv("LARGEDET_DATASETS", str(tmp_path / "nothing_here"))
    register_all_openimages()
    assert MetadataCatalog.get("openimages_v6_val").boxes_csv.startswith(
        str(tmp_path / "nothing_here")
    )
    with pytest.raises(FileNotFoundError, match="validation-annotations-bbox.csv"):
        DatasetCatalog.get("openimages_v6_val")


def test_fixture_trains_through_detectron2(tmp_path):
    root = str(tmp_path / "fixture")
    register_openimages_fixture(root, cache_dir=str(tmp_path / "cache"))
    assert not os.path.exists(root)  # generated on first use
    cfg = get_cfg()
    add_largedet_config(cfg)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.META_ARCHITECTURE = "GeneralizedRCNN"
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[8], [16], [32], [64], [128]]
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = len(FIXTURE_CLASSES)
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 1
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 64
    cfg.MODEL.WEIGHTS = ""
    cfg.INPUT.MIN_SIZE_TRAIN = (48,)  # the fixture's 128x96 images at half size
    cfg.INPUT.MAX_SIZE_TRAIN = 64
    cfg.MODEL.RPN.PRE_NMS_TOPK_TRAIN = 200
    cfg.MODEL.RPN.POST_NMS_TOPK_TRAIN = 50
    cfg.DATASETS.TRAIN = ("openimages_fixture_train",)
    cfg.SOLVER.IMS_PER_BATCH = 2
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.SAMPLER_TRAIN = "RepeatFactorTrainingSampler"
    cfg.DATALOADER.REPEAT_THRESHOLD = 0.5
    torch.manual_seed(0)
    model = build_model(cfg)
    loader = build_detection_train_loader(cfg)
    batch = next(iter(loader))
    assert len(batch) == 2 and all(len(x["instances"]) > 0 for x in batch)
    before = [p.detach().clone() for p in model.parameters()]
    # SimpleTrainer raises FloatingPointError on a non-finite loss.
    SimpleTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.001)).train(0, 1)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert os.path.isfile(os.path.join(root, "oidv6-train-annotations-bbox.csv"))
