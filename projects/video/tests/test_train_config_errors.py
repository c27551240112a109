"""projects/video/train.py: a config that cannot run is one line on stderr, exit 2, before
any worker starts (largedet's checks plus the video project's own keys and files)."""

import glob
import os

import launch_testing
import pytest
from detectron2.config import get_cfg
from largedet.config.validate import TRAINING_RULES, check_values, merge_checked

from largedet_video import add_video_config
from largedet_video.engine.checks import VIDEO_RULES

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


def run_rejected(args, tmp_path):
    """Run train.py with ``args``; it must stop with one ``error:`` line and exit 2, with no
    model built and no video generated. Returns that line."""
    datasets = tmp_path / "datasets"
    env = dict(os.environ, LARGEDET_DATASETS=str(datasets), OMP_NUM_THREADS="1")
    return launch_testing.run_rejected(TRAIN_PY, args, env, [datasets])


@pytest.mark.parametrize(
    "args,expected",
    [
        (["MODEL.VIDEO.BACKBONE", "TSMResnet"],
         "error: MODEL.VIDEO.BACKBONE: 'TSMResnet' is not registered; registered: I3DResNet, TSMResNet, TSNResNet"),
        (["INPUT.VIDEO.NUM_FRAME", "4"],
         "error: INPUT.VIDEO.NUM_FRAME: no such config key; did you mean INPUT.VIDEO.NUM_FRAMES?"),
        (["DATASETS.TRAIN", "('moving_shape_train',)"],
         "error: DATASETS.TRAIN: dataset 'moving_shape_train' is not registered; registered names close to it: "
         "moving_shapes_train"),
        # an integer for a float key is taken as that float; multigrid needs a step schedule
        (["SOLVER.BASE_LR", "1", "MULTIGRID.LONG_CYCLE", "True", "SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR"],
         "error: SOLVER.LR_SCHEDULER_NAME: must be 'WarmupMultiStepLR' with multigrid"),
        (["MULTIGRID.LONG_CYCLE", "True", "SOLVER.LR_SCHEDULER_NAME", "WarmupMultiStepLR",
          "SOLVER.IMS_PER_DEVICE", "4", "SOLVER.BATCH_RAMP.BATCHES", "(8,)",
          "SOLVER.BATCH_RAMP.EPOCHS", "(1.0,)"],
         "error: SOLVER.BATCH_RAMP: a batch ramp and MULTIGRID both set the batch of each step"),
        (["SOLVER.IMS_PER_DEVICE", "4", "SOLVER.BATCH_RAMP.BATCHES", "(6,)", "SOLVER.BATCH_RAMP.EPOCHS", "(1.0,)"],
         "error: SOLVER.BATCH_RAMP.BATCHES: 6 is not a whole multiple of world size 1 x SOLVER.IMS_PER_DEVICE 4"),
    ],
)  # fmt: skip
def test_config_errors_are_one_line_before_launch(args, expected, tmp_path):
    assert run_rejected(args, tmp_path).startswith(expected)


def test_missing_config_file_and_dataset_file(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    assert run_rejected(["--config-file", missing], tmp_path) == f"error: {missing}: config file not found"
    csv = os.path.join(str(tmp_path / "kinetics"), "annotations", "train.csv")
    line = run_rejected(
        ["DATASETS.KINETICS.ROOT", str(tmp_path / "kinetics"), "DATASETS.TRAIN", "('kinetics400_train',)"],
        tmp_path,
    )
    assert line == f"error: {csv}: file of dataset 'kinetics400_train' (DATASETS.TRAIN) not found"


def test_every_video_config_passes_the_value_checks():
    configs = glob.glob(os.path.join(CONFIG_DIR, "*.yaml"))
    assert len(configs) >= 5
    for path in configs:
        cfg = add_video_config(get_cfg())
        merge_checked(cfg, path, [])
        check_values(cfg, (*TRAINING_RULES, *VIDEO_RULES))


def test_torchcodec_decoder_that_cannot_decode_here_is_a_config_error(monkeypatch):
    from largedet.config.validate import ConfigError
    from largedet_video.data import checks, register_video_datasets
    from largedet_video.engine.checks import check_video_config

    cfg = add_video_config(get_cfg())
    merge_checked(cfg, os.path.join(CONFIG_DIR, "tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml"),
                  ["INPUT.VIDEO.DECODER", "torchcodec"])  # fmt: skip
    register_video_datasets(cfg)
    monkeypatch.setattr(checks, "torchcodec_unavailable", lambda: "no FFmpeg here")
    with pytest.raises(ConfigError, match=r"^INPUT.VIDEO.DECODER: 'torchcodec': no FFmpeg here$"):
        check_video_config(cfg, 1)
    monkeypatch.setattr(checks, "torchcodec_unavailable", lambda: None)
    check_video_config(cfg, 1)  # decodes here: no error


def test_no_config_file_outside_the_checkout_is_a_config_error(tmp_path):
    # an installed largedet_video without the checkout's configs: the built-in demo's
    # config is missing, and the run says so instead of failing to open it
    import argparse

    from largedet.config.validate import ConfigError
    from largedet_video.engine.checks import check_video_args

    missing = str(tmp_path / "configs" / "demo.yaml")
    args = argparse.Namespace(config_file=None, opts=[], eval_only=False, num_gpus=1,
                              num_machines=1)  # fmt: skip
    with pytest.raises(ConfigError, match=r"part of the largedet checkout .*pass --config-file") as e:
        check_video_args(args, default_config=missing)
    assert str(e.value).startswith(f"{missing}: ")
