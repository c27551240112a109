"""largedet.utils.denormals: denormal floats flushed to zero on the CPU for the length of a
run (CPU_FLUSH_DENORMAL), and the earlier mode put back after it."""

import logging

import pytest
import torch
from detectron2.config import get_cfg

from largedet.config import add_largedet_config
from largedet.utils.denormals import denormals_flushed, flush_denormal_on

DENORMAL = 1e-39  # below float32's smallest normal number


def _cfg(device="cpu", flush=True):
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.DEVICE = device
    cfg.CPU_FLUSH_DENORMAL = flush
    return cfg


def _product():
    return float(torch.tensor([DENORMAL], dtype=torch.float32).mul(1.0)[0])


def test_the_key_is_on_by_default_and_torch_keeps_denormals_outside_a_run():
    assert add_largedet_config(get_cfg()).CPU_FLUSH_DENORMAL is True
    assert not flush_denormal_on() and _product() == pytest.approx(DENORMAL, rel=1e-3)


def test_a_cpu_run_flushes_them_and_puts_the_mode_back(caplog):
    with caplog.at_level(logging.INFO, logger="largedet.utils.denormals"):
        with denormals_flushed(_cfg()) as flushed:
            assert flushed and flush_denormal_on()
            assert _product() == 0.0
            assert float(torch.tensor([2e-38]).mul(1.0)[0]) == pytest.approx(2e-38)  # a normal one stays
    assert not flush_denormal_on() and _product() != 0.0
    assert any("CPU_FLUSH_DENORMAL" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("device, flush", [("cpu", False), ("cuda", True)])
def test_without_the_key_or_off_the_cpu_nothing_changes(device, flush):
    with denormals_flushed(_cfg(device, flush)) as flushed:
        assert not flushed and _product() != 0.0
    assert not flush_denormal_on()


def test_the_mode_comes_back_after_an_error_and_an_earlier_mode_is_kept():
    with pytest.raises(RuntimeError):
        with denormals_flushed(_cfg()):
            raise RuntimeError("a failed run")
    assert not flush_denormal_on()
    torch.set_flush_denormal(True)  # set by the caller before the run: left as it was
    try:
        with denormals_flushed(_cfg(flush=False)) as flushed:
            assert flushed
        assert flush_denormal_on()
    finally:
        torch.set_flush_denormal(False)


def test_train_or_evaluate_trains_with_them_flushed():
    import argparse

    from largedet.engine import train_or_evaluate

    seen = []

    class RecordingTrainer:
        def __init__(self, cfg):
            pass

        def resume_or_load(self, resume):
            pass

        def train(self):
            seen.append(flush_denormal_on())
            return {}

    args = argparse.Namespace(eval_only=False, resume=False)
    assert train_or_evaluate(RecordingTrainer, _cfg(), args) == {}
    assert train_or_evaluate(RecordingTrainer, _cfg(flush=False), args) == {}
    assert seen == [True, False] and not flush_denormal_on()
