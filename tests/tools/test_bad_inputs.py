"""tools/train_net.py: each bad input is one line naming its file or key, exit 2, before any
process starts (no model built, no dataset generated): a GPU config on a machine without one,
OpenImages files missing, a truncated or inconsistent COCO json, a missing MODEL.WEIGHTS, an
unknown PREEMPTION.SIGNALS name, an unregistered dataset (with how to register one)."""

import json
import os

import pytest
import torch

from test_train_net import CONFIG, ROOT, run_rejected

OPENIMAGES = os.path.join(ROOT, "configs", "openimages_r50_fpn_bs640.yaml")


def coco_json(path, annotations=None, categories=None):
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "height": 64, "width": 64}],
        "annotations": annotations
        if annotations is not None
        else [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 10, 12], "area": 120, "iscrowd": 0}],
        "categories": categories if categories is not None else [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
    }
    path.write_text(json.dumps(data))
    return str(path)


def mine(json_file, image_root):
    return ["DATASETS.COCO_JSONS", f"[['mine', '{json_file}', '{image_root}']]",
            "DATASETS.TRAIN", "('mine',)", "DATASETS.TEST", "()"]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    line = run_rejected(["--config", CONFIG, "MODEL.DEVICE", "cuda"], tmp_path)
    assert line.startswith("error: MODEL.DEVICE: 'cuda' asks for a GPU, but torch ")
    assert line.endswith("finds no CUDA device on this machine; set MODEL.DEVICE cpu, or auto to use a GPU where there is one")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_with_num_gpus_is_refused_before_any_process(tmp_path):
    line = run_rejected(["--config", CONFIG, "--num-gpus", "8", "SOLVER.IMS_PER_BATCH", "8", "MODEL.DEVICE", "cuda"], tmp_path)
    assert line.startswith("error: MODEL.DEVICE: 'cuda' asks for a GPU")


def test_openimages_config_without_its_files(tmp_path):
    line = run_rejected(["--config", OPENIMAGES, "--num-gpus", "8", "MODEL.DEVICE", "cpu"], tmp_path)
    csv = os.path.join(str(tmp_path / "ld"), "openimages", "class-descriptions-boxable.csv")
    assert line == (
        f"error: {csv}: file of dataset 'openimages_v6_train' (DATASETS.TRAIN) not found; OpenImages is "
        "read from DATASETS.OPENIMAGES.ROOT (docs/evaluation.md)"
    )


def test_truncated_annotation_json(tmp_path):
    path = tmp_path / "train.json"
    coco_json(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path)], tmp_path)
    assert line.startswith(f"error: {path}: not valid JSON (")
    assert line.endswith("a file cut short by an interrupted copy or download reads so (dataset 'mine', DATASETS.TRAIN)")


def test_category_id_absent_from_categories(tmp_path):
    ann = {"id": 7, "image_id": 1, "category_id": 9, "bbox": [1, 2, 3, 4], "iscrowd": 0}
    path = coco_json(tmp_path / "train.json", annotations=[ann])
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path)], tmp_path)
    assert line == (
        f"error: {path}: annotations[0] (id 7, image 1): category_id 9 is not among the ids of "
        "'categories' (1, 2) (dataset 'mine', DATASETS.TRAIN)"
    )


def test_duplicate_image_ids_are_refused_before_launch(tmp_path):
    """Two images with one id: Detectron2 would attach the annotations of both to one of
    them and train on wrong labels without a word."""
    path = tmp_path / "train.json"
    coco_json(path)
    data = json.loads(path.read_text())
    data["images"].append(dict(data["images"][0], file_name="b.jpg"))
    path.write_text(json.dumps(data))
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path)], tmp_path)
    assert line == (
        f"error: {path}: images[1] has the id 1 of images[0]: annotations would attach to the wrong "
        "image (dataset 'mine', DATASETS.TRAIN)"
    )


def test_duplicate_annotation_ids_are_one_line(tmp_path):
    ann = {"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4], "iscrowd": 0}
    path = coco_json(tmp_path / "train.json", annotations=[ann, dict(ann, bbox=[5, 5, 3, 3])])
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path)], tmp_path)
    assert line == (
        f"error: {path}: annotations[1] has the id 7 of annotations[0]: ids must be unique "
        "(dataset 'mine', DATASETS.TRAIN)"
    )


def test_a_file_name_that_escapes_the_image_root_is_refused(tmp_path):
    path = tmp_path / "train.json"
    coco_json(path)
    data = json.loads(path.read_text())
    data["images"][0]["file_name"] = "../secret/a.jpg"
    path.write_text(json.dumps(data))
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path)], tmp_path)
    assert line.startswith(f"error: {path}: images[0] file_name '../secret/a.jpg' is outside the image folder")


def test_missing_image_folder_of_a_coco_json(tmp_path):
    path = coco_json(tmp_path / "train.json")
    line = run_rejected(["--config", CONFIG, *mine(path, tmp_path / "images")], tmp_path)
    assert line == f"error: {tmp_path / 'images'}: image folder of dataset 'mine' (DATASETS.TRAIN) not found"


def test_coco_jsons_entry_that_is_not_a_triple(tmp_path):
    line = run_rejected(["--config", CONFIG, "DATASETS.COCO_JSONS", "[['mine', 'a.json']]"], tmp_path)
    assert line == (
        "error: DATASETS.COCO_JSONS[0]: expected [name, json_file, image_root] (three non-empty strings), "
        "got ['mine', 'a.json']"
    )


def test_coco_jsons_name_of_a_built_in_dataset(tmp_path):
    path = coco_json(tmp_path / "train.json")
    line = run_rejected(["--config", CONFIG, "DATASETS.COCO_JSONS", f"[['coco_2017_train', '{path}', '{tmp_path}']]"],
                        tmp_path)  # fmt: skip
    assert line == "error: DATASETS.COCO_JSONS: 'coco_2017_train' is already registered (a built-in dataset); give yours another name"


def test_unregistered_dataset_says_how_to_register_one(tmp_path):
    line = run_rejected(["--config", CONFIG, "DATASETS.TRAIN", "('my_coco_train',)"], tmp_path)
    assert line.startswith("error: DATASETS.TRAIN: dataset 'my_coco_train' is not registered; ")
    assert line.endswith(
        "; register a COCO-format dataset with DATASETS.COCO_JSONS [[name, json_file, image_root]] "
        "(docs/training.md#your-own-coco-dataset), or any dataset in a module given to --import "
        "(docs/extend.md)"
    )


def test_missing_weights_file(tmp_path):
    weights = str(tmp_path / "model_final.pth")
    line = run_rejected(["--config", CONFIG, "MODEL.WEIGHTS", weights], tmp_path)
    assert line == f"error: MODEL.WEIGHTS: {weights}: not found"
    line = run_rejected(["--config", CONFIG, "--eval-only", "MODEL.WEIGHTS", str(tmp_path)], tmp_path)
    assert line == f"error: MODEL.WEIGHTS: {tmp_path}: is a folder, not a file"


def test_unknown_preemption_signal(tmp_path):
    line = run_rejected(["--config", CONFIG, "PREEMPTION.SIGNALS", "('SIGTERM', 'SIGTREM')"], tmp_path)
    assert line == (
        "error: PREEMPTION.SIGNALS: 'SIGTREM' is not a signal that can be caught "
        "(e.g. 'SIGTERM', 'SIGUSR1', 'SIGUSR2')"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_a_job_checked_for_other_machines_is_not_refused_for_this_ones_device(tmp_path, monkeypatch):
    # tools/submit.py checks a job that runs on the compute nodes, whose GPUs this machine lacks
    import argparse

    from largedet.config.validate import ConfigError
    from largedet.engine import check_args

    monkeypatch.setenv("LARGEDET_DATASETS", str(tmp_path / "ld"))
    args = argparse.Namespace(config_file=CONFIG, opts=["MODEL.DEVICE", "cuda", "SOLVER.IMS_PER_BATCH", "16",
                                                        "OUTPUT_DIR", str(tmp_path / "o")],
                              eval_only=False, num_gpus=8, num_machines=2)  # fmt: skip
    with pytest.raises(ConfigError, match=r"^MODEL.DEVICE: 'cuda' asks for a GPU"):
        check_args(args)
    plan = check_args(argparse.Namespace(**vars(args), check_device=False))
    assert plan.world_size == 16 and args.opts[:2] == ["MODEL.DEVICE", "cuda"]  # args unchanged


def test_the_unregistered_dataset_hint_names_a_docs_section():
    with open(os.path.join(ROOT, "docs", "training.md")) as f:
        assert "## Your own COCO dataset\n" in f.read()  # docs/training.md#your-own-coco-dataset


def test_negative_num_workers_is_one_line_before_launch(tmp_path):
    line = run_rejected(["--config", CONFIG, "DATALOADER.NUM_WORKERS", "-1"], tmp_path)
    assert line == "error: DATALOADER.NUM_WORKERS: must be an integer >= 0 (loader processes per training process), got -1"


def test_a_pixel_limit_below_one_is_one_line(tmp_path):
    line = run_rejected(["--config", CONFIG, "DATALOADER.MAX_IMAGE_PIXELS", "0"], tmp_path)
    assert line == "error: DATALOADER.MAX_IMAGE_PIXELS: must be an integer >= 1 (pixels), got 0"


def test_an_explicit_dist_url_whose_port_is_taken_is_one_line(tmp_path):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = run_rejected(["--config", CONFIG, "--num-gpus", "2", "--dist-url", f"tcp://127.0.0.1:{port}",
                             "MODEL.DEVICE", "cpu"], tmp_path)  # fmt: skip
    assert line == (
        f"error: --dist-url tcp://127.0.0.1:{port}: port {port} is in use on this machine (another run, or "
        "a process that still holds it); give another port, or leave --dist-url out on one machine (a "
        "free port is picked)"
    )
