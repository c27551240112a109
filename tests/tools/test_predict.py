"""Pictures of predictions: tools/predict.py (a model's boxes on images, from a 2-step run's
last checkpoint or random weights) and tools/visualize_json_results.py (a results file
beside the ground truth)."""

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
from detectron2.data.detection_utils import read_image

from test_train_net import CONFIG, ROOT, TRAIN_NET

PREDICT = os.path.join(ROOT, "tools", "predict.py")
VISUALIZE = os.path.join(ROOT, "tools", "visualize_json_results.py")


def shapes_opts(spec):
    return ["DATASETS.SHAPES.ROOT", spec.root, "DATASETS.SHAPES.NUM_TRAIN", str(spec.num_train),
            "DATASETS.SHAPES.NUM_VAL", str(spec.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(spec.image_size),
            "DATASETS.SHAPES.SEED", str(spec.seed), "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "64"]  # fmt: skip


def run(script, *args):
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    return proc


def rgb(path):
    return cv2.imread(str(path))[:, :, ::-1]


def test_predict_after_a_two_step_run_writes_one_grid(tiny_shapes, tmp_path):
    out_dir = tmp_path / "run"
    train = run(TRAIN_NET, "--config", CONFIG, *shapes_opts(tiny_shapes), "INPUT.MIN_SIZE_TRAIN", "(64,)",
                "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "2",
                "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "(1,)", "DATASETS.TEST", "()",
                "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", str(out_dir))  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    # what `make demo` runs after training: the last checkpoint, 6 validation images, one grid
    proc = run(PREDICT, "--config", CONFIG, "--resume", "--dataset", "shapes_val", "--num-images", "6",
               "--columns", "4", *shapes_opts(tiny_shapes), "OUTPUT_DIR", str(out_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"weights: {out_dir / 'model_final.pth'}"
    assert len([line for line in lines if " detection(s) scoring >= 0.5" in line]) == 6
    assert lines[-1] == f"predictions: {out_dir / 'predictions.jpg'}"
    grid = cv2.imread(str(out_dir / "predictions.jpg"))
    assert grid.shape == (2 * 64 + 4, 4 * 64 + 3 * 4, 3)  # 6 pictures of 64 px: 2 rows of 4 columns, 4 px gaps


@pytest.fixture
def png_images(tiny_shapes, tmp_path):
    """Three validation images of the tiny shapes set, as PNG (lossless, to compare pixels)."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(1, 4):
        image = cv2.imread(os.path.join(tiny_shapes.image_root("val"), f"{i:06d}.jpg"))
        cv2.imwrite(str(folder / f"img{i}.png"), image)
    return folder


def test_predict_draws_boxes_above_the_threshold_and_nothing_else(tiny_shapes, png_images, tmp_path):
    flags = ["--config", CONFIG, "--input", str(png_images / "*.png")]
    overrides = [*shapes_opts(tiny_shapes), "MODEL.WEIGHTS", "", "SEED", "0"]  # trailing, as in Detectron2
    # random weights score every box about 1/4: all are drawn at threshold 0, none above 1
    none = run(PREDICT, *flags, "--confidence-threshold", "1.01", "--output", str(tmp_path / "none"), *overrides)
    assert none.returncode == 0, none.stderr[-3000:]
    assert none.stdout.splitlines()[0] == "weights: none (random initialisation)"
    assert none.stdout.splitlines()[1] == "labels: the class names of shapes_val (circle, square, triangle)"
    for i in range(1, 4):
        assert np.array_equal(rgb(tmp_path / "none" / f"img{i}.png"), rgb(png_images / f"img{i}.png"))
    every = run(PREDICT, *flags, "--confidence-threshold", "0", "--output", str(tmp_path / "all"), *overrides)
    assert every.returncode == 0, every.stderr[-3000:]
    counts = [int(line.split(": ")[1].split()[0]) for line in every.stdout.splitlines() if "detection(s)" in line]
    assert len(counts) == 3 and all(n > 0 for n in counts)
    for i in range(1, 4):
        drawn, image = rgb(tmp_path / "all" / f"img{i}.png"), rgb(png_images / f"img{i}.png")
        assert drawn.shape == image.shape and (drawn != image).any()
    assert f"predictions: {tmp_path / 'all' / 'img3.png'}" in every.stdout.splitlines()


def test_predict_refuses_a_missing_input_in_one_line(tmp_path):
    proc = run(PREDICT, "--config", CONFIG, "--input", str(tmp_path / "nope.jpg"), "MODEL.WEIGHTS", "")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"error: {tmp_path / 'nope.jpg'}: no such image file"


def results_on(tiny_shapes, path, extra=()):
    """Detections equal to the ground truth of the first validation image (score 0.9), and
    one box at score 0.1 on the second."""
    with open(tiny_shapes.json_file("val")) as f:
        gt = json.load(f)
    first = [a for a in gt["annotations"] if a["image_id"] == 1]
    results = [{"image_id": 1, "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9} for a in first]
    results.append({"image_id": 2, "category_id": 1, "bbox": [5.0, 5.0, 20.0, 20.0], "score": 0.1})
    path.write_text(json.dumps(results + list(extra)))
    return str(path), first


def test_visualize_json_results_draws_detections_beside_the_ground_truth(tiny_shapes, tmp_path):
    results, first = results_on(tiny_shapes, tmp_path / "results.json")
    assert first  # the first image has shapes
    out = tmp_path / "pictures"
    proc = run(VISUALIZE, "--input", results, "--dataset", "shapes_val", "--output", str(out),
               "--num-images", "2", "--config", CONFIG, *shapes_opts(tiny_shapes))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == f"2 picture(s) (predictions | ground truth) in {out}"
    assert sorted(os.listdir(out)) == ["000001.png", "000002.png"]
    with open(tiny_shapes.json_file("val")) as f:
        annotated = {a["image_id"] for a in json.load(f)["annotations"]}
    for i, detected in ((1, True), (2, False)):
        image = read_image(os.path.join(tiny_shapes.image_root("val"), f"{i:06d}.jpg"), format="RGB")
        picture = rgb(out / f"{i:06d}.png")
        assert picture.shape == (64, 2 * 64 + 4, 3)
        left, gap, right = picture[:, :64], picture[:, 64:68], picture[:, 68:]
        assert not gap.any()
        # image 1's detections (0.9) are drawn; image 2's only one (0.1) is below the threshold
        assert (left != image).any() == detected
        assert (right != image).any() == (i in annotated)
        if not detected:
            assert np.array_equal(left, image)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([{"image_id": 1, "category_id": 9, "bbox": [1, 1, 2, 2], "score": 0.5}],
         "image 1: category_id 9 is not a category of the dataset (1, 2, 3)"),
        ([{"image_id": 1, "category_id": 1, "bbox": [1, 1, 2, 2]}], "entry {last}: no 'score'"),
    ],
)  # fmt: skip
def test_visualize_json_results_names_a_bad_entry(tiny_shapes, tmp_path, extra, message):
    results, first = results_on(tiny_shapes, tmp_path / "results.json", extra)
    message = message.format(last=len(first) + 1)  # the extra entry comes after image 1's and image 2's
    proc = run(VISUALIZE, "--input", results, "--dataset", "shapes_val", "--output", str(tmp_path / "p"),
               "--config", CONFIG, *shapes_opts(tiny_shapes))  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"error: {results}: {message}"


def _own_run_folder(tiny_shapes, tmp_path):
    """A run's output folder on the user's 2-class data (ids 3 and 7): the config.yaml that
    training writes there, without checkpoints."""
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet.config.validate import merge_checked
    from own_data_testing import own_data_opts

    run_dir = tmp_path / "my_run"
    run_dir.mkdir()
    cfg = add_largedet_config(get_cfg())
    merge_checked(cfg, CONFIG, [*own_data_opts(tiny_shapes, str(tmp_path)), *shapes_opts(tiny_shapes),
                                "MODEL.ROI_HEADS.NUM_CLASSES", "2", "OUTPUT_DIR", str(run_dir)])  # fmt: skip
    (run_dir / "config.yaml").write_text(cfg.dump())
    return run_dir


def test_predict_on_a_run_folder_labels_with_the_runs_classes(tiny_shapes, png_images, tmp_path):
    run_dir = _own_run_folder(tiny_shapes, tmp_path)
    proc = run(PREDICT, "--config", str(run_dir), "--input", str(png_images / "img1.png"),
               "--output", str(tmp_path / "out"), "MODEL.WEIGHTS", "")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[1] == "labels: the class names of my_val (apple, pear)"
    assert "warning: the model has" not in proc.stderr


def test_predict_warns_when_the_model_has_other_classes_than_the_names(tiny_shapes, png_images, tmp_path):
    # the base config's names (shapes_val: 3) on a 2-class model: drawn, with a warning naming both
    proc = run(PREDICT, "--config", CONFIG, "--input", str(png_images / "img1.png"), "--output",
               str(tmp_path / "out"), *shapes_opts(tiny_shapes), "MODEL.WEIGHTS", "",
               "MODEL.ROI_HEADS.NUM_CLASSES", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "warning: the model has 2 classes (MODEL.ROI_HEADS.NUM_CLASSES) but shapes_val names 3 "
        "(circle, square, triangle)" in proc.stderr
    )


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    proc = run(PREDICT, "--config", str(tmp_path), "--input", "x.png")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path}: a folder without config.yaml")


def test_visualize_an_unregistered_dataset_says_how_to_register_one(tmp_path):
    proc = run(VISUALIZE, "--input", str(tmp_path / "r.json"), "--dataset", "my_val", "--output", str(tmp_path))
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --dataset: dataset 'my_val' is not registered; ")
    assert "DATASETS.COCO_JSONS [[name, json_file, image_root]]" in line


def test_class_labels_name_the_model_and_the_dataset(tiny_shapes):
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet.engine.labels import class_labels

    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    labels = class_labels(cfg, ["tiny_shapes_val"])
    assert labels.notes == ["labels: the class names of tiny_shapes_val (circle, square, triangle)"]
    assert labels.warning == ""
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 80
    assert class_labels(cfg, ["tiny_shapes_val"]).warning.startswith(
        "warning: the model has 80 classes (MODEL.ROI_HEADS.NUM_CLASSES) but tiny_shapes_val names 3"
    )
    assert class_labels(cfg, ["nothing_registered"]).metadata is None
