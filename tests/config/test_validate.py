"""largedet.config.validate: a config that cannot run is one ConfigError naming the key or
file, raised before any worker starts; every shipped config passes."""

import glob
import os

import pytest

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from largedet.config import add_largedet_config
from largedet.data import ShapesSpec, register_shapes, shapes_spec_from_config
from largedet.solver.batch import BatchPlan
from largedet.config.validate import TRAINING_RULES, ConfigError, check_values, merge_checked
from largedet.data.checks import check_datasets
from largedet.engine.defaults import check_config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG_DIR = os.path.join(ROOT, "configs")
SHAPES_CONFIG = os.path.join(CONFIG_DIR, "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
BASE = os.path.abspath(os.path.join(CONFIG_DIR, "shapes", "Base-Shapes-R18-FPN.yaml"))


def defaults():
    return add_largedet_config(get_cfg())


def shapes_cfg(*opts):
    """The demo config with ``opts``, its shapes dataset registered (generated on first use)."""
    cfg = defaults()
    merge_checked(cfg, SHAPES_CONFIG, opts)
    register_shapes(shapes_spec_from_config(cfg))
    return cfg


def message(fn, *args, **kwargs):
    with pytest.raises(ConfigError) as error:
        fn(*args, **kwargs)
    text = str(error.value)
    assert "\n" not in text
    return text


# --- merging -----------------------------------------------------------------------------------


def test_an_integer_for_a_float_key_on_the_command_line_is_that_float():
    cfg = defaults()
    opts = merge_checked(cfg, SHAPES_CONFIG, ["SOLVER.BASE_LR", "1", "SOLVER.MAX_ITER", "7"])
    assert opts == ["SOLVER.BASE_LR", "1.0", "SOLVER.MAX_ITER", "7"]
    assert cfg.SOLVER.BASE_LR == 1.0 and isinstance(cfg.SOLVER.BASE_LR, float)
    # the returned overrides are what every worker merges as Detectron2 does
    plain = defaults()
    plain.merge_from_file(SHAPES_CONFIG)
    plain.merge_from_list(opts)
    assert plain.SOLVER.BASE_LR == 1.0 and plain.SOLVER.MAX_ITER == 7


@pytest.mark.parametrize(
    "opts,expected",
    [
        (["SOLVER.BASE_LRR", "0.1"], "SOLVER.BASE_LRR: no such config key; did you mean SOLVER.BASE_LR?"),
        (["solver.pmd.period", "3"], "solver.pmd.period: no such config key; did you mean SOLVER.PMD.PERIOD?"),
        (["NOTHING.LIKE.IT", "3"], "NOTHING.LIKE.IT: no such config key"),
        (["SOLVER.MAX_ITER", "1.5"], "SOLVER.MAX_ITER: expected an integer, got 1.5"),
        (["SOLVER.BASE_LR", "True"], "SOLVER.BASE_LR: expected a float, got True"),
        (["SOLVER.MAX_ITER"], "SOLVER.MAX_ITER: an override without a value (trailing KEY VALUE pairs)"),
    ],
)  # fmt: skip
def test_bad_overrides(opts, expected):
    assert message(merge_checked, defaults(), None, opts) == expected


def test_config_file_errors(tmp_path):
    def write(name, text):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    cases = {
        write("int.yaml", f"_BASE_: {BASE}\nSOLVER:\n  BASE_LR: 1\n"):
            "SOLVER.BASE_LR: expected a float, got 1; write 1.0",
        write("key.yaml", f"_BASE_: {BASE}\nSOLVER:\n  PMD:\n    PERIDO: 5\n"):
            "SOLVER.PMD.PERIDO: no such config key; did you mean SOLVER.PMD.PERIOD?",
        write("broken.yaml", "SOLVER: [\n"): "not valid YAML",
        write("empty.yaml", ""): "not a mapping of config keys",
        write("base.yaml", "_BASE_: missing.yaml\n"): f"cannot read {tmp_path / 'missing.yaml'}",
        write("a.yaml", "_BASE_: b.yaml\n"): "its _BASE_ files form a cycle",
        str(tmp_path / "nope.yaml"): "config file not found",
    }  # fmt: skip
    write("b.yaml", "_BASE_: a.yaml\n")
    for path, expected in cases.items():
        text = message(merge_checked, defaults(), path, [])
        assert text.startswith(f"{path}: ") and expected in text, text


def test_every_shipped_config_merges_and_passes_the_value_checks():
    configs = glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True)
    assert len(configs) > 10
    for path in configs:
        cfg = defaults()
        merge_checked(cfg, path, [])
        check_values(cfg, TRAINING_RULES)


# --- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opts,expected",
    [
        (["SOLVER.OPTIMIZER", "Adam"],
         "SOLVER.OPTIMIZER: 'Adam' is not registered; registered: AdamW, LAMB, LARS, PMD_LAMB, SGD"),
        (["SOLVER.PMD.PERIOD", "-1"], "SOLVER.PMD.PERIOD: must be an integer >= 1 (optimizer steps), got -1"),
        (["SOLVER.BASE_LR", "0"], "SOLVER.BASE_LR: must be a number > 0, got 0.0"),
        (["SOLVER.LSR.ENABLED", "True", "SOLVER.LSR.REFERENCE_LR", "-0.1"],
         "SOLVER.LSR.REFERENCE_LR: must be a number > 0, got -0.1"),
        (["SOLVER.LAMB.BETAS", "(0.9, 1.0)"], "SOLVER.LAMB.BETAS: must be two numbers in [0, 1), got (0.9, 1.0)"),
        (["SOLVER.PMD.DECAY", "cos"],
         "SOLVER.PMD.DECAY: must be one of 'cosine', 'linear', 'none', got 'cos'"),
        (["SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.PRECISION", "fp8"], "SOLVER.AMP.PRECISION must be one of"),
        (["SOLVER.AGVM.ENABLED", "True", "SOLVER.AGVM.REFERENCE", "trunk"],
         "SOLVER.AGVM.REFERENCE: 'trunk' is not a part of SOLVER.AGVM.GROUPS"),
        (["SOLVER.AGVM.ENABLED", "True"], "SOLVER.AGVM.ENABLED needs two independent gradient estimates"),
        (["LOG_PERIOD", "0"], "LOG_PERIOD: must be an integer >= 1, got 0"),
        (["WANDB.MODE", "offlne"],
         "WANDB.MODE: must be one of '', 'disabled', 'offline', 'online', got 'offlne'"),
        (["SOLVER.IMS_PER_DEVICE", "3"], "SOLVER.IMS_PER_BATCH 8 is not a whole multiple of world size 1"),
        (["MODEL_EMA.ENABLED", "True", "MODEL_EMA.DECAY", "1.5"], "MODEL_EMA.DECAY: must be a number in [0, 1), got 1.5"),
        (["MODEL_EMA.ENABLED", "True", "MODEL_EMA.EVAL", "raw"],
         "MODEL_EMA.EVAL: must be one of 'both', 'ema', 'model', got 'raw'"),
        (["SOLVER.LR_SCHEDULER_NAME", "WarmupStableDecayLR", "SOLVER.WSD.DECAY_START", "1.0"],
         "SOLVER.WSD.DECAY_START: must be a number in (0, 1), got 1.0"),
        (["SOLVER.LR_SCHEDULER_NAME", "WarmupPoly"], "SOLVER.LR_SCHEDULER_NAME: must be one of"),
        (["SOLVER.REFERENCE_WORLD_SIZE", "8"],
         "SOLVER.REFERENCE_WORLD_SIZE: must be 0 (SOLVER.IMS_PER_BATCH is the global batch on any number of devices"),
        (["SOLVER.IMS_PER_DEVICE", "4", "SOLVER.BATCH_RAMP.BATCHES", "(6,)", "SOLVER.BATCH_RAMP.EPOCHS", "(1.0,)"],
         "SOLVER.BATCH_RAMP.BATCHES: 6 is not a whole multiple of world size 1 x SOLVER.IMS_PER_DEVICE 4 = 4"),
    ],
)  # fmt: skip
def test_values_name_the_key(opts, expected):
    assert message(check_config, shapes_cfg(*opts), 1).startswith(expected)


def test_a_valid_config_gives_its_batch_plan():
    assert check_config(shapes_cfg("SOLVER.IMS_PER_DEVICE", "2"), 2) == BatchPlan(8, 2, 2, 2)
    # evaluation only: no batch, no solver checks
    assert check_config(shapes_cfg("SOLVER.PMD.PERIOD", "0"), None) is None


# --- datasets --------------------------------------------------------------------------------------


def test_unregistered_dataset_lists_close_names():
    cfg = shapes_cfg("DATASETS.TRAIN", "('shape_train',)")
    text = message(check_datasets, cfg, ("DATASETS.TRAIN",))
    assert text.startswith("DATASETS.TRAIN: dataset 'shape_train' is not registered; ")
    assert "shapes_train" in text
    assert message(check_config, shapes_cfg("DATASETS.TRAIN", "()"), 1).startswith(
        "DATASETS.TRAIN: no dataset given"
    )


def test_missing_annotation_file_but_not_for_generated_shapes(tmp_path):
    name = "validate_test_coco_missing"
    json_file = str(tmp_path / "instances.json")
    DatasetCatalog.register(name, list)
    MetadataCatalog.get(name).set(json_file=json_file, image_root=str(tmp_path), evaluator_type="coco")
    try:
        cfg = shapes_cfg("DATASETS.TEST", f"('{name}',)")
        assert message(check_datasets, cfg, ("DATASETS.TEST",)) == (
            f"{json_file}: annotation file of dataset '{name}' (DATASETS.TEST) not found"
        )
        (tmp_path / "instances.json").write_text("{}")  # present, but not a COCO instances file
        assert message(check_datasets, cfg, ("DATASETS.TEST",)) == (
            f"{json_file}: no 'images' list: not a COCO annotation file (dataset '{name}', DATASETS.TEST)"
        )
        (tmp_path / "instances.json").write_text('{"images": [], "annotations": [], "categories": []}')
        check_datasets(cfg, ("DATASETS.TEST",))
        (tmp_path / "instances.json").write_text("{}")
        MetadataCatalog.remove(name)  # another format (LVIS): its file is only looked for
        MetadataCatalog.get(name).set(json_file=json_file, image_root=str(tmp_path), evaluator_type="lvis")
        check_datasets(cfg, ("DATASETS.TEST",))
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    # the shapes set is generated on first use: its missing json is no error
    register_shapes(ShapesSpec(root=str(tmp_path / "not_yet")), prefix="validate_test_shapes")
    try:
        cfg = shapes_cfg("DATASETS.TRAIN", "('validate_test_shapes_train',)")
        check_datasets(cfg, ("DATASETS.TRAIN",))
        assert not (tmp_path / "not_yet").exists()
    finally:
        for split in ("train", "val"):
            DatasetCatalog.remove(f"validate_test_shapes_{split}")
            MetadataCatalog.remove(f"validate_test_shapes_{split}")
