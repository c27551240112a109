"""A user's own data through a LazyConfig: a dataset that the config's code registers with
Detectron2's register_coco_instances is registered once however often a script sets the
config up in one process; another json under a registered name stays an error; and the
data are checked before launch with the one-line errors of tools/train_net.py."""

import argparse
import json
import os

import pytest
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image

import launch_testing
from largedet.config.lazy import lazy_output_dir, register_datasets, setup_lazy_config
from largedet.config.validate import ConfigError
from largedet.engine.lazy import check_lazy_args

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "lazyconfig_train_net.py")
EXAMPLE = os.path.join(ROOT, "configs", "shapes", "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")

LAZY_CONFIG = '''from detectron2.config import LazyConfig
from detectron2.data.datasets import register_coco_instances

_example = LazyConfig.load({example!r})
model, dataloader, optimizer, lr_multiplier, train = (
    _example[k] for k in ("model", "dataloader", "optimizer", "lr_multiplier", "train")
)
register_coco_instances({name!r}, {{}}, {json_file!r}, {image_root!r})
dataloader.train.dataset.names = {name!r}
dataloader.test.dataset.names = {name!r}
train.output_dir = {out!r}
'''


def own_data(folder, categories=3):
    """One 32 x 24 image with a box, and its json of ``categories`` categories."""
    images = folder / "images"
    images.mkdir(parents=True)
    Image.new("RGB", (32, 24)).save(images / "1.jpg")
    json_file = folder / "train.json"
    json_file.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "1.jpg", "width": 32, "height": 24}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 8, 8], "area": 64, "iscrowd": 0}],
        "categories": [{"id": c, "name": f"c{c}"} for c in range(1, categories + 1)],
    }))  # fmt: skip
    return str(json_file), str(images)


def lazy_config(path, name, json_file, image_root, out):
    path.write_text(LAZY_CONFIG.format(example=EXAMPLE, name=name, json_file=json_file,
                                       image_root=image_root, out=str(out)))  # fmt: skip
    return str(path)


def script_args(config_file, *opts):
    return argparse.Namespace(config_file=config_file, opts=list(opts), eval_only=False, num_gpus=1,
                              num_machines=1, check_device=False)  # fmt: skip


def test_a_registration_in_the_config_runs_once_per_process(tmp_path):
    json_file, images = own_data(tmp_path / "data")
    config = lazy_config(tmp_path / "mine.py", "lazy_data_mine", json_file, images, tmp_path / "out")
    args = script_args(config)
    # what tools/lazyconfig_train_net.py does in one process: check, output folder, main
    plan = check_lazy_args(args)
    assert lazy_output_dir(args) == str(tmp_path / "out")
    cfg = setup_lazy_config(args, log=False)
    assert plan.world_size == 1 and cfg.dataloader.train.dataset.names == "lazy_data_mine"
    assert MetadataCatalog.get("lazy_data_mine").json_file == json_file

    # another config that registers another json under that name is refused in one line
    other_json, other_images = own_data(tmp_path / "other")
    other = lazy_config(tmp_path / "other.py", "lazy_data_mine", other_json, other_images, tmp_path / "o")
    with pytest.raises(ConfigError) as e:
        check_lazy_args(script_args(other))
    assert str(e.value) == f"{other}: Dataset 'lazy_data_mine' is already registered!"
    assert MetadataCatalog.get("lazy_data_mine").json_file == json_file


def test_a_registration_in_datasets_is_idempotent(tmp_path):
    from detectron2.config import LazyCall as L
    from detectron2.data.datasets import register_coco_instances
    from omegaconf import OmegaConf

    json_file, images = own_data(tmp_path / "data")
    other_json, _ = own_data(tmp_path / "other")

    def config(json_file):
        return OmegaConf.create({"datasets": {"mine": L(register_coco_instances)(
            name="lazy_data_entry", metadata={}, json_file=json_file, image_root=images)}})  # fmt: skip

    register_datasets(config(json_file))
    register_datasets(config(json_file))  # the same registration again: nothing to do
    assert "lazy_data_entry" in DatasetCatalog.list()
    with pytest.raises(ConfigError) as e:
        register_datasets(config(other_json))
    assert str(e.value) == (
        f"datasets: 'lazy_data_entry' is registered already, with json {json_file} and images {images}; "
        f"this config registers {other_json} and {images}: give it another name"
    )


def test_the_models_classes_against_the_lazy_configs_json(tmp_path):
    json_file, images = own_data(tmp_path / "data", categories=4)  # the example's model has 3 classes
    config = lazy_config(tmp_path / "four.py", "lazy_data_four", json_file, images, tmp_path / "out")
    with pytest.raises(ConfigError) as e:
        check_lazy_args(script_args(config))
    assert str(e.value) == (
        f"model.roi_heads.num_classes: 3, but {json_file} (dataset 'lazy_data_four') has 4 categories, "
        "which the model could not tell apart; set model.roi_heads.num_classes 4"
    )


def test_missing_data_is_train_nets_one_line_before_the_model_is_built(tmp_path):
    json_file = str(tmp_path / "data" / "train.json")  # never written
    config = lazy_config(tmp_path / "missing.py", "lazy_data_missing", json_file, str(tmp_path), tmp_path / "out")
    env = dict(os.environ, LARGEDET_DATASETS=str(tmp_path / "ld"), OMP_NUM_THREADS="1")
    line = launch_testing.run_rejected(SCRIPT, ["--config", config], env, [tmp_path / "ld", tmp_path / "out"])
    # tools/train_net.py's line for the same dataset (tests/tools/test_bad_inputs.py)
    assert line == f"error: {json_file}: annotation file of dataset 'lazy_data_missing' (DATASETS.TRAIN) not found"
