"""SOLVER.CHECKPOINT_MAX_TO_KEEP (largedet.engine.hooks.PruningPeriodicCheckpointer):
Detectron2's max_to_keep over the whole folder, the final and the tagged checkpoints kept."""

import os

from engine_testing import tiny_cfg

from largedet.engine import Trainer
from largedet.engine.hooks import PruningPeriodicCheckpointer


def checkpoints(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".pth"))


def test_keeps_the_newest_periodic_checkpoints_and_the_final_one(tiny_shapes, tmp_path):
    # a checkpoint after each of 5 steps; 2 kept
    cfg = tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", "5", "SOLVER.CHECKPOINT_PERIOD", "1",
                   "SOLVER.CHECKPOINT_MAX_TO_KEEP", "2")  # fmt: skip
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert checkpoints(tmp_path) == ["model_0000003.pth", "model_0000004.pth", "model_final.pth"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"

    # an earlier invocation's checkpoints are pruned too; the tagged one is never deleted
    (hook,) = [h for h in trainer._hooks if isinstance(h, PruningPeriodicCheckpointer)]
    for name in ("model_0000000.pth", "model_0000001.pth"):
        (tmp_path / name).write_bytes((tmp_path / "model_0000003.pth").read_bytes())
    (tmp_path / "last_checkpoint").write_text("model_0000000.pth")
    assert hook.prune() == ["model_0000001.pth"]
    assert checkpoints(tmp_path) == [
        "model_0000000.pth", "model_0000003.pth", "model_0000004.pth", "model_final.pth"
    ]  # fmt: skip


def test_zero_keeps_every_checkpoint(tiny_shapes, tmp_path):
    cfg = tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "1")
    assert cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP == 0
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert checkpoints(tmp_path) == [f"model_000000{i}.pth" for i in range(4)] + ["model_final.pth"]
