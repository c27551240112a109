"""The autocast dtype a config asks for and gets: ``SOLVER.AMP.NATIVE_ONLY`` autocasts only
where the device computes the dtype in hardware, and the demo config loads with it."""

import os

import pytest
import torch

import largedet  # noqa: F401
from detectron2.config import get_cfg
from largedet.config import add_largedet_config, amp_dtype
from largedet.config import device as device_module
from largedet.config.device import native_precision
from largedet.engine import check_args, largedet_argument_parser, setup_cfg
from largedet.engine import trainer as trainer_module
from largedet.solver import run_plan
from largedet.solver.batch import BatchPlan

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEMO = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml")

# /proc/cpuinfo flags of two x86 CPUs: AVX-512 with and without its bfloat16 instructions
ZEN4 = frozenset({"fpu", "avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"})
SKYLAKE_SP = frozenset({"fpu", "avx2", "avx512f", "avx512bw", "avx512_vnni"})
SAPPHIRE_RAPIDS = frozenset({"avx512f", "amx_bf16", "amx_tile", "avx512_fp16"})


@pytest.mark.parametrize(
    "family, flags, precision, native",
    [
        ("x86", ZEN4, "bfloat16", True),
        ("x86", SKYLAKE_SP, "bfloat16", False),  # AVX-512 alone emulates bfloat16
        ("x86", SAPPHIRE_RAPIDS, "bfloat16", True),
        ("x86", ZEN4, "float16", False),
        ("x86", SAPPHIRE_RAPIDS, "float16", True),
        ("x86", frozenset(), "bfloat16", False),  # no /proc/cpuinfo: nothing is native
        ("arm", frozenset({"fp", "asimd", "bf16"}), "bfloat16", True),
        ("arm", frozenset({"fp", "asimd"}), "bfloat16", False),
        ("arm", frozenset({"fp", "asimd", "asimdhp"}), "float16", True),
    ],
)
def test_native_precision_from_the_cpu_flags(monkeypatch, family, flags, precision, native):
    monkeypatch.setattr(device_module, "_cpu_family", lambda: family)
    assert native_precision("cpu", precision, flags) is native


def amp_cfg(native_only, precision="bfloat16", enabled=True):
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.DEVICE = "cpu"
    cfg.SOLVER.AMP.ENABLED = enabled
    cfg.SOLVER.AMP.PRECISION = precision
    cfg.SOLVER.AMP.NATIVE_ONLY = native_only
    return cfg


@pytest.mark.parametrize("flags, expected", [(ZEN4, torch.bfloat16), (SKYLAKE_SP, None)])
def test_native_only_autocasts_where_the_cpu_has_the_dtype(monkeypatch, flags, expected):
    monkeypatch.setattr(device_module, "_cpu_family", lambda: "x86")
    monkeypatch.setattr(device_module, "cpu_flags", lambda: flags)
    cfg = amp_cfg(native_only=True)
    assert amp_dtype(cfg) is expected
    # what the trainer's loop autocasts to: the trainer builds its loop with this function's
    assert trainer_module.amp_dtype is amp_dtype and trainer_module.amp_dtype(cfg) is expected
    block = run_plan(cfg, 1).describe(cfg, "SGD")
    if expected is None:
        assert "full precision: cpu has no native bfloat16 (SOLVER.AMP.NATIVE_ONLY)" in block
    else:
        assert "AMP bfloat16" in block and "full precision" not in block
    # without NATIVE_ONLY the dtype asked for is used on any CPU; AMP off is float32
    assert amp_dtype(amp_cfg(native_only=False)) is torch.bfloat16
    assert amp_dtype(amp_cfg(native_only=True, enabled=False)) is None
    with pytest.raises(ValueError, match="SOLVER.AMP.PRECISION must be one of"):
        amp_dtype(amp_cfg(native_only=True, precision="float8"))


def test_cpu_flags_are_read_from_proc_cpuinfo():
    device_module.cpu_flags.cache_clear()
    flags = device_module.cpu_flags()
    if not os.path.exists("/proc/cpuinfo"):
        assert flags == frozenset()
        return
    with open("/proc/cpuinfo") as f:
        line = next((ln for ln in f if ln.split(":")[0].strip() in ("flags", "Features")), "")
    assert flags == frozenset(line.partition(":")[2].split())


def test_the_demo_config_loads_and_uses_bfloat16_only_where_native():
    args = largedet_argument_parser().parse_args(["--config", DEMO])
    assert check_args(args) == BatchPlan(8, 1, 8, 1)
    cfg = setup_cfg(args, log=False)
    solver = cfg.SOLVER
    assert (solver.AMP.ENABLED, solver.AMP.PRECISION, solver.AMP.NATIVE_ONLY) == (True, "bfloat16", True)
    assert (solver.LR_SCHEDULER_NAME, solver.MAX_ITER, solver.WSD.DECAY_START) == ("WarmupStableDecayLR", 900, 0.8)
    assert cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE == 32
    # a narrower, shallower model at twice the main job's LR; the main job's data, batch and evaluation
    assert cfg.MODEL.BACKBONE.NAME == "build_basic_resnet_fpn_backbone"
    assert (cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS) == (10, 32, 32)
    assert cfg.MODEL.FPN.OUT_CHANNELS == 32 and cfg.SOLVER.BASE_LR == 0.04
    main = setup_cfg(
        largedet_argument_parser().parse_args(
            ["--config", os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")]
        ),
        log=False,
    )
    for key in ("DATASETS", "INPUT", "TEST"):
        assert cfg[key] == main[key], key
    assert cfg.SOLVER.IMS_PER_BATCH == main.SOLVER.IMS_PER_BATCH
    native = native_precision(cfg.MODEL.DEVICE, "bfloat16")
    assert amp_dtype(cfg) is (torch.bfloat16 if native else None)
