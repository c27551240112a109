"""A plain Detectron2 DefaultTrainer with largedet's build_optimizer loads IMS_PER_BATCH /
world size images per step whatever SOLVER.IMS_PER_DEVICE says: build_optimizer says so in
one warning; largedet's Trainer, which applies the key, gets none."""

import logging

import pytest
from detectron2.engine import DefaultTrainer

from engine_testing import tiny_cfg
from largedet.engine import Trainer
from largedet.solver import build_optimizer

UNAPPLIED = (
    "SOLVER.IMS_PER_DEVICE 2 is not applied by this trainer: a Detectron2 trainer loads IMS_PER_BATCH / "
    "world size = 4 / 1 images per device per step; largedet.engine.Trainer (or its build_train_loader and "
    "AccumulationTrainer) accumulates 2-image micro-batches, or set SOLVER.IMS_PER_DEVICE 0"
)


class PlainTrainer(DefaultTrainer):
    @classmethod
    def build_optimizer(cls, cfg, model):
        return build_optimizer(cfg, model)


@pytest.fixture
def warnings():
    """The warnings of largedet.solver.build, caught on its own logger (Detectron2's
    setup_logger, run by other tests, stops the "largedet" logger from propagating)."""
    caught = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno == logging.WARNING:
                caught.append(record.getMessage())

    handler, log = Catch(), logging.getLogger("largedet.solver.build")
    log.addHandler(handler)
    yield caught
    log.removeHandler(handler)


def test_plain_default_trainer_is_told_that_ims_per_device_is_not_applied(tiny_shapes, tmp_path, warnings):
    trainer = PlainTrainer(tiny_cfg(str(tmp_path / "d2"), "SOLVER.IMS_PER_DEVICE", 2))
    assert warnings == [UNAPPLIED]
    assert len(next(iter(trainer.data_loader))) == 4  # what it trains on per step: 4 images, not 2
    warnings.clear()
    PlainTrainer(tiny_cfg(str(tmp_path / "d2_same"), "SOLVER.IMS_PER_DEVICE", 4))  # 4 x 1 = the batch: applied
    assert warnings == []


def test_largedet_trainer_applies_it_without_a_warning(tiny_shapes, tmp_path, warnings):
    trainer = Trainer(tiny_cfg(str(tmp_path / "ld"), "SOLVER.IMS_PER_DEVICE", 2))
    assert warnings == []
    assert trainer.plan.batch.per_device == 2 and trainer.plan.batch.accumulation == 2
