"""Training goes on past unreadable images and decompression bombs, with loader workers, and
counts them in ``data/skipped_images``."""

import json

from detectron2.data import DatasetCatalog
from engine_testing import tiny_cfg
from unreadable_testing import damaged_copies, register

from largedet.engine import Trainer
from largedet.data.build import DetectionTrainLoader

DAMAGE = {2: "truncated", 9: "random_bytes", 17: "deleted", 20: "bomb"}


def test_training_goes_on_and_counts_every_unreadable_draw(tiny_shapes, tmp_path):
    dicts = damaged_copies(DatasetCatalog.get("tiny_shapes_train"), tmp_path / "images", DAMAGE)
    name = register("damaged_tiny_shapes_train", dicts, like="tiny_shapes_train")
    # 12 steps x 4 images = 2 epochs of the 24 images: each damaged one is drawn twice (a
    # decompression bomb, over PIL's limit, would otherwise stop the run at the same step on
    # every resume).
    cfg = tiny_cfg(
        str(tmp_path / "run"),
        "DATASETS.TRAIN", (name,), "SOLVER.MAX_ITER", 12, "LOG_PERIOD", 4,
        "DATALOADER.NUM_WORKERS", 2,
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()

    loader = trainer.loop.data_loader
    assert isinstance(loader, DetectionTrainLoader) and loader.num_skipped == 8
    with open(tmp_path / "run" / "metrics.json") as f:
        rows = [json.loads(line) for line in f]
    key = "data/skipped_images"
    counts = [(r["iteration"], r[key]) for r in rows if key in r]
    assert [it for it, _ in counts] == [3, 7, 11]
    assert counts[-1][1] == 8 and counts[0][1] <= counts[1][1] <= counts[2][1]
