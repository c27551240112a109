"""projects/video/train.py: a bad list file, a label past MODEL.VIDEO.NUM_CLASSES, a GPU config
on a machine without one, a missing MODEL.WEIGHTS: one line naming the file or key, exit 2,
before any process starts."""

import pytest
import torch

from test_train_config_errors import run_rejected


def with_list(list_file, split="TRAIN"):
    return ["DATASETS.VIDEO_LISTS", f"[['mine', '{list_file}', '']]", f"DATASETS.{split}", "('mine',)"]


def test_missing_list_file(tmp_path):
    missing = tmp_path / "train.txt"
    assert run_rejected(with_list(missing), tmp_path) == (
        f"error: {missing}: list file of dataset 'mine' (DATASETS.VIDEO_LISTS) not found"
    )


def test_list_file_that_is_a_folder(tmp_path):
    folder = tmp_path / "lists"
    folder.mkdir()
    assert run_rejected(with_list(folder), tmp_path) == (
        f"error: {folder}: list file of dataset 'mine' (DATASETS.VIDEO_LISTS) is a folder, not a list file"
    )


def test_missing_video_folder(tmp_path):
    list_file = tmp_path / "train.txt"
    list_file.write_text("a.mp4 0\n")
    root = tmp_path / "videos"
    assert run_rejected(["DATASETS.VIDEO_LISTS", f"[['mine', '{list_file}', '{root}']]", "DATASETS.TRAIN",
                         "('mine',)"], tmp_path) == (
        f"error: {root}: video folder of dataset 'mine' (DATASETS.VIDEO_LISTS) not found"
    )  # fmt: skip


def test_label_outside_num_classes(tmp_path):
    list_file = tmp_path / "train.txt"
    list_file.write_text("# path label\na.mp4 0\nb.mp4 3\nc.mp4 4\n")  # the demo's NUM_CLASSES is 4
    assert run_rejected(with_list(list_file), tmp_path) == (
        f"error: {list_file}:4: label 4 is outside [0, 4) (MODEL.VIDEO.NUM_CLASSES 4; dataset 'mine', DATASETS.TRAIN)"
    )
    list_file.write_text("a.mp4 -1\n")
    assert run_rejected(with_list(list_file, "TEST"), tmp_path).startswith(
        f"error: {list_file}:1: label -1 is outside [0, 4) (MODEL.VIDEO.NUM_CLASSES 4; dataset 'mine', DATASETS.TEST)"
    )


def test_list_entry_that_is_not_a_triple(tmp_path):
    assert run_rejected(["DATASETS.VIDEO_LISTS", "[['mine', 'a.txt']]"], tmp_path) == (
        "error: DATASETS.VIDEO_LISTS[0]: expected [name, list_file, root] (strings), got ['mine', 'a.txt']"
    )


def test_missing_weights(tmp_path):
    weights = tmp_path / "model_final.pth"
    assert run_rejected(["MODEL.WEIGHTS", str(weights)], tmp_path) == f"error: MODEL.WEIGHTS: {weights}: not found"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_without_a_gpu(tmp_path):
    assert run_rejected(["MODEL.DEVICE", "cuda"], tmp_path).startswith(
        "error: MODEL.DEVICE: 'cuda' asks for a GPU, but torch "
    )
