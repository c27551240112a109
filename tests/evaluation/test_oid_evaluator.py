"""OIDEvaluator (Detectron2) and the command line of tools/oid_eval.py
(largedet.evaluation.oid_cli) on one hand-made validation set."""

import csv
import json
import os

import pytest
import torch

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog
from detectron2.structures import Boxes, Instances

from largedet.config import add_largedet_config
from largedet.data.openimages import register_openimages
from largedet.evaluation.oid_cli import main as oid_eval_main
from largedet.evaluation.oid_evaluator import OIDEvaluator

ANIMAL, DOG, CAT = 0, 1, 2  # contiguous ids = vocabulary order

# Two images: img0 is 200 wide and 100 high, img1 100 wide and 200 high.
#   img0: a Dog box (0.1, 0.1, 0.5, 0.5) and a group-of Cat box (0.5, 0.5, 1, 1);
#         Dog and Cat verified present.
#   img1: a Dog box (0, 0, 0.5, 0.5); Dog verified present, Cat verified absent.
# Hierarchy: Animal -> {Dog, Cat}, so Animal has 3 boxes (one group-of) and is
# verified present on both images.
BOXES = (
    "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax,IsOccluded,IsTruncated,IsGroupOf,IsDepiction,IsInside\n"
    "img0,xclick,/m/dog,1,0.1,0.5,0.1,0.5,0,0,0,0,0\n"
    "img0,xclick,/m/cat,1,0.5,1.0,0.5,1.0,0,0,1,0,0\n"
    "img1,xclick,/m/dog,1,0.0,0.5,0.0,0.5,0,0,0,0,0\n"
)
LABELS = (
    "ImageID,Source,LabelName,Confidence\n"
    "img0,verification,/m/dog,1\nimg0,verification,/m/cat,1\n"
    "img1,verification,/m/dog,1\nimg1,verification,/m/cat,0\n"
)
CLASSES = "/m/animal,Animal\n/m/dog,Dog\n/m/cat,Cat\n"
HIERARCHY = {
    "LabelName": "/m/0bl9f",
    "Subcategory": [
        {
            "LabelName": "/m/animal",
            "Subcategory": [{"LabelName": "/m/dog"}, {"LabelName": "/m/cat"}],
        }
    ],
}
# Model outputs, in pixels: (image, width, height, [(class, score, box)]).
OUTPUTS = [
    (
        "img0",
        200,
        100,
        [
            (DOG, 0.9, (20, 10, 100, 50)),  # the Dog box: TP
            (CAT, 0.8, (110, 60, 150, 90)),  # inside the group-of Cat box: absorbed
            (CAT, 0.6, (160, 55, 190, 95)),  # inside the group-of Cat box: absorbed
        ],
    ),
    (
        "img1",
        100,
        200,
        [
            (CAT, 0.95, (10, 150, 40, 190)),  # Cat verified absent: FP
            (DOG, 0.7, (0, 0, 50, 100)),  # the Dog box: TP
            (DOG, 0.4, (60, 120, 90, 190)),  # overlaps nothing: FP
        ],
    ),
]
# Dog:    0.9 TP, 0.7 TP, 0.4 FP over 2 boxes -> AP = (1 + 1) / 2 = 1.
# Cat:    0.95 FP, 0.8 TP (the group-of box, its best score) over 1 box -> AP = 0.5.
# Animal: no Animal detection, 3 boxes -> AP 0.          mAP = (1 + 0.5 + 0) / 3 = 0.5.
# With the detections copied to Animal: 0.95 FP, 0.9 TP, 0.8 TP (group-of), 0.7 TP,
# 0.4 FP; precision 0, 1/2, 2/3, 3/4, 3/5; envelope at the TPs 3/4 each:
# AP = 3 * 0.75 / 3 = 0.75.                             mAP = (0.75 + 1 + 0.5) / 3 = 0.75.


@pytest.fixture
def dataset(tmp_path):
    paths = {}
    for key, name, text in (
        ("boxes", "boxes.csv", BOXES),
        ("labels", "labels.csv", LABELS),
        ("classes", "classes.csv", CLASSES),
        ("hierarchy", "h.json", json.dumps(HIERARCHY)),
    ):
        paths[key] = str(tmp_path / name)
        with open(paths[key], "w") as f:
            f.write(text)
    register_openimages(
        "oid_eval_test",
        paths["boxes"],
        str(tmp_path / "images"),
        paths["classes"],
        paths["labels"],
        paths["hierarchy"],
        cache_dir=str(tmp_path / "cache"),
    )
    paths["cache"] = str(tmp_path / "cache")
    yield paths
    for name in ("oid_eval_test", "oid_eval_test_flat"):
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)


def run_evaluator(evaluator, images=("img0", "img1")):
    evaluator.reset()
    for image_id, width, height, dets in OUTPUTS:
        if image_id not in images:
            continue
        inst = Instances((height, width))
        inst.pred_boxes = Boxes(torch.tensor([d[2] for d in dets], dtype=torch.float32))
        inst.scores = torch.tensor([d[1] for d in dets])
        inst.pred_classes = torch.tensor([d[0] for d in dets])
        evaluator.process(
            [{"image_id": image_id, "height": height, "width": width}], [{"instances": inst}]
        )
    return evaluator.evaluate()["bbox"]


def test_evaluator_reproduces_the_hand_computed_metric(dataset, tmp_path):
    results = run_evaluator(
        OIDEvaluator("oid_eval_test", distributed=True, expand_detections=False)
    )
    assert results["AP50"] == pytest.approx(50.0)
    assert results["AP50-Dog"] == pytest.approx(100.0)
    assert results["AP50-Cat"] == pytest.approx(50.0)
    assert results["AP50-Animal"] == pytest.approx(0.0)

    out = str(tmp_path / "out")
    results = run_evaluator(OIDEvaluator("oid_eval_test", output_dir=out, expand_detections=True))
    assert results["AP50"] == pytest.approx(75.0)
    assert results["AP50-Animal"] == pytest.approx(75.0)
    with open(os.path.join(out, "oid_per_class_ap.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["DisplayName"], float(r["AP"]), int(r["NumGroundTruth"])) for r in rows] == [
        ("Animal", 0.75, 3),
        ("Dog", 1.0, 2),
        ("Cat", 0.5, 1),
    ]
    # The written detections (6 + their 6 Animal copies) score the same through the CLI.
    with open(os.path.join(out, "oid_detections.csv")) as f:
        assert len(f.readlines()) == 1 + 12
    lines = run_cli(dataset, os.path.join(out, "oid_detections.csv"))
    assert lines[-1] == "mAP@0.5: 0.750000"


def test_evaluator_scores_only_the_processed_images(dataset):
    # img0 only: Dog 0.9 TP of 1 box -> 1; Cat group-of TP of 1 box -> 1; Animal 2
    # boxes, no detection -> 0. mAP = 2/3.
    results = run_evaluator(
        OIDEvaluator("oid_eval_test", expand_detections=False), images=("img0",)
    )
    assert results["AP50"] == pytest.approx(200 / 3)


def test_evaluator_from_config_and_errors(dataset):
    cfg = get_cfg()
    add_largedet_config(cfg)
    assert cfg.TEST.OPENIMAGES.EXPAND_DETECTIONS is True
    assert run_evaluator(OIDEvaluator(cfg, "oid_eval_test"))["AP50"] == pytest.approx(75.0)
    evaluator = OIDEvaluator("oid_eval_test")
    evaluator.reset()
    evaluator.process(
        [{"image_id": "img9", "height": 10, "width": 10}],
        [
            {
                "instances": Instances(
                    (10, 10),
                    pred_boxes=Boxes(torch.zeros(0, 4)),
                    scores=torch.zeros(0),
                    pred_classes=torch.zeros(0, dtype=torch.long),
                )
            }
        ],
    )
    with pytest.raises(ValueError, match="'img9'"):
        evaluator.evaluate()
    with pytest.raises(ValueError, match="not an OpenImages dataset"):
        OIDEvaluator("coco_2017_val")

    # Without a hierarchy: nothing expanded, Animal has no box (left out);
    # mAP = (Dog 1 + Cat 0.5) / 2 = 0.75. Expansion asked explicitly is an error.
    register_openimages(
        "oid_eval_test_flat", dataset["boxes"], "unused", dataset["classes"], dataset["labels"],
        cache_dir=dataset["cache"],
    )  # fmt: skip
    results = run_evaluator(OIDEvaluator(cfg, "oid_eval_test_flat"))
    assert results["AP50"] == pytest.approx(75.0) and "AP50-Animal" not in results
    with pytest.raises(ValueError, match="needs a hierarchy_json"):
        OIDEvaluator("oid_eval_test_flat", expand_detections=True)


# ------------------------------------------------------------------------------ CLI


def run_cli(paths, detections, *extra, expect_rc=0, capsys=None):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = oid_eval_main(
            [
                "--boxes",
                paths["boxes"],
                "--image-labels",
                paths["labels"],
                "--hierarchy",
                paths["hierarchy"],
                "--class-descriptions",
                paths["classes"],
                "--detections",
                detections,
                *extra,
            ]
        )
    assert rc == expect_rc, err.getvalue()
    return (out.getvalue() if rc == 0 else err.getvalue()).splitlines()


DETECTIONS = (
    "ImageID,LabelName,Score,XMin,XMax,YMin,YMax\n"
    "img0,/m/dog,0.9,0.1,0.5,0.1,0.5\n"
    "img0,/m/cat,0.8,0.55,0.75,0.6,0.9\n"
    "img0,/m/cat,0.6,0.8,0.95,0.55,0.95\n"
    "img1,/m/cat,0.95,0.1,0.4,0.75,0.95\n"
    "img1,/m/dog,0.7,0.0,0.5,0.0,0.5\n"
    "img1,/m/dog,0.4,0.6,0.9,0.6,0.95\n"
    "img7,/m/dog,0.99,0.0,1.0,0.0,1.0\n"  # an image without ground truth: ignored
)


def test_cli_prints_the_metric_and_per_class_file(dataset, tmp_path):
    det = tmp_path / "det.csv"
    det.write_text(DETECTIONS)
    per_class = str(tmp_path / "per_class.csv")
    lines = run_cli(dataset, str(det), "--per-class", per_class)
    assert lines[-1] == "mAP@0.5: 0.500000"  # (Animal 0 + Dog 1 + Cat 0.5) / 3
    with open(per_class) as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["LabelName", "DisplayName", "AP", "NumGroundTruth", "NumDetections"],
        ["/m/animal", "Animal", "0.000000", "3", "0"],
        ["/m/dog", "Dog", "1.000000", "2", "3"],
        ["/m/cat", "Cat", "0.500000", "1", "1"],
    ]


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "ImageID,LabelName,XMin,XMax,YMin,YMax\nimg0,/m/dog,0,1,0,1\n",
            "det.csv, line 1, column 'Score': missing column(s) Score",
        ),
        (
            "ImageID,LabelName,Score,XMin,XMax,YMin,YMax\nimg0,/m/dog,0.5,0,1,0,1\nimg0,/m/bird,0.5,0,1,0,1\n",
            "det.csv, line 3, column 'LabelName': unknown LabelName '/m/bird': not in the class descriptions",
        ),
        (
            "ImageID,LabelName,Score,XMin,XMax,YMin,YMax\nimg0,/m/dog,high,0,1,0,1\n",
            "det.csv, line 2, column 'Score': expected a number, found 'high'",
        ),
        (
            "ImageID,LabelName,Score,XMin,XMax,YMin,YMax\nimg0,/m/dog,0.5,0,1,0,1.2\n",
            "det.csv, line 2, column 'YMax': YMax = 1.2 is outside [0, 1]",
        ),
        (
            "ImageID,LabelName,Score,XMin,XMax,YMin,YMax\nimg0,/m/dog,0.5,0.7,0.6,0,1\n",
            "det.csv, line 2, column 'XMin': XMin = 0.7 is greater than XMax = 0.6",
        ),
    ],
)
def test_cli_errors(dataset, tmp_path, text, message):
    det = tmp_path / "det.csv"
    det.write_text(text)
    lines = run_cli(dataset, str(det), expect_rc=1)
    assert lines[-1].startswith(f"error: {det.parent}/{message}")


def test_cli_missing_file(dataset, tmp_path):
    lines = run_cli(dataset, str(tmp_path / "absent.csv"), expect_rc=1)
    assert lines[-1].startswith("error:") and "absent.csv" in lines[-1]
