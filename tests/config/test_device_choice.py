"""MODEL.DEVICE: a config that names a GPU gets one or is refused (never a silent CPU run);
``auto`` falls back to the CPU with a line saying so."""

import pytest
import torch
from detectron2.config import get_cfg

from largedet.config import AUTO_DEVICE, DeviceUnavailableError, add_largedet_config, device_for, resolve_device


def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch, "__version__", "2.0.0+cpu")


def gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch, "__version__", "2.0.0+cu124")


def test_auto_is_cpu_without_a_gpu_and_says_so(monkeypatch):
    no_gpu(monkeypatch)
    assert AUTO_DEVICE == "auto"
    assert device_for("auto") == ("cpu", "MODEL.DEVICE auto: no CUDA device found, running on the CPU")
    assert device_for("auto", "train.device") == ("cpu", "train.device auto: no CUDA device found, running on the CPU")


def test_auto_is_cuda_with_a_gpu(monkeypatch):
    gpus(monkeypatch, 2)
    assert device_for("auto") == ("cuda", "MODEL.DEVICE auto: 2 CUDA device(s) found, running on cuda")


@pytest.mark.parametrize("asked", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_refused_in_one_line(monkeypatch, asked):
    no_gpu(monkeypatch)
    with pytest.raises(DeviceUnavailableError) as e:
        device_for(asked)
    assert str(e.value) == (
        f"MODEL.DEVICE: {asked!r} asks for a GPU, but torch 2.0.0+cpu (no CUDA) finds no CUDA device "
        "on this machine; set MODEL.DEVICE cpu, or auto to use a GPU where there is one"
    )


def test_cuda_index_past_the_devices_is_refused(monkeypatch):
    gpus(monkeypatch, 2)
    assert device_for("cuda:1") == ("cuda:1", None)
    with pytest.raises(DeviceUnavailableError, match=r"^MODEL.DEVICE: 'cuda:2' asks for a GPU, but torch "
                       r"2.0.0\+cu124 \(CUDA 12.4\) finds 2 CUDA device\(s\) on this machine;"):  # fmt: skip
        device_for("cuda:2")


def test_a_broken_driver_is_no_gpu(monkeypatch):
    # torch built with CUDA, the driver not loading: is_available() is False
    no_gpu(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(DeviceUnavailableError, match=r"\(CUDA 12.4\) finds no CUDA device"):
        device_for("cuda")


@pytest.mark.parametrize("asked", ["cpu", "mps"])
def test_other_devices_are_taken_as_they_are(monkeypatch, asked):
    no_gpu(monkeypatch)
    assert device_for(asked) == (asked, None)


def test_resolve_device_sets_the_config_and_returns_the_line(monkeypatch):
    no_gpu(monkeypatch)
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.DEVICE = "auto"
    assert resolve_device(cfg) == "MODEL.DEVICE auto: no CUDA device found, running on the CPU"
    assert cfg.MODEL.DEVICE == "cpu"
    assert resolve_device(cfg) is None  # "cpu" stays
    cfg.MODEL.DEVICE = "cuda"
    with pytest.raises(DeviceUnavailableError):
        resolve_device(cfg)


def test_a_misspelt_cuda_device_is_named(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(DeviceUnavailableError) as e:
        device_for("cuda1")
    assert str(e.value) == "MODEL.DEVICE: 'cuda1' is not a torch device (cuda, cuda:N, cpu, auto)"
