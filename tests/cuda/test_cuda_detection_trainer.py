"""Detectron2's Faster and Mask R-CNN R50-FPN train on CUDA through largedet's Trainer, from
largedet's own batch-1056 configs shrunk to a few steps (PMD-LAMB, Sync-BN, the LSR, gradient
accumulation), under AMP, with the Detectron2 that is installed: on the GPU machine the
registry build, whose compiled ``detectron2._C`` does not load there (R-CNN needs none of it:
RoIAlign and NMS come from torchvision). The GPU check records which one ran."""

import math
import os

import pytest
import torch
from engine_testing import weights
from torch import nn

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.engine import HookBase
from largedet.config import add_largedet_config
from largedet.engine import Trainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
MAX_ITER = 4
RPN_AND_BOX_LOSSES = {"loss_cls", "loss_box_reg", "loss_rpn_cls", "loss_rpn_loc"}


def trainable(model):
    """name -> a copy of each trainable parameter."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


class RecordLosses(HookBase):
    def __init__(self):
        self.losses = []

    def after_step(self):
        self.losses.append(dict(self.trainer.loop.last_losses))


def shrunk_cfg(config, amp, output_dir):
    """``config`` on tiny_shapes (3 classes) at 128 px, random weights, 2 micro-batches of 2
    images per step, MAX_ITER steps, AMP ``amp``; everything else as the file says."""
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(CONFIGS, config))
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", "cuda", "MODEL.WEIGHTS", "", "MODEL.ROI_HEADS.NUM_CLASSES", "3",
            "DATASETS.TRAIN", "('tiny_shapes_train',)", "DATASETS.TEST", "()",
            "INPUT.MIN_SIZE_TRAIN", "(128,)", "INPUT.MAX_SIZE_TRAIN", "128",
            "INPUT.MASK_FORMAT", "bitmask",  # the shapes dataset stores RLE masks
            "DATALOADER.NUM_WORKERS", "0",
            "SOLVER.IMS_PER_BATCH", "4", "SOLVER.IMS_PER_DEVICE", "2",
            "SOLVER.MAX_ITER", str(MAX_ITER), "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()",
            "SOLVER.CHECKPOINT_PERIOD", "1000",
            "SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.PRECISION", amp,
            "OUTPUT_DIR", str(output_dir),
        ]
    )  # fmt: skip
    cfg.freeze()
    return cfg


@pytest.mark.parametrize("amp", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "config, mask", [("r50_fpn_bs1056.yaml", False), ("mask_rcnn_r50_fpn_bs1056.yaml", True)]
)
def test_rcnn_r50_fpn_trains_through_the_trainer(
    nccl_group, tiny_shapes, tmp_path, config, mask, amp
):
    trainer = Trainer(shrunk_cfg(config, amp, tmp_path))
    assert trainer.plan.batch.accumulation == 2
    assert type(trainer.optimizer).__name__ == "PMDLAMB"
    assert any(type(m) is nn.SyncBatchNorm for m in trainer.model.modules())
    assert next(trainer.model.parameters()).is_cuda
    record = RecordLosses()
    trainer.register_hooks([record])
    before = trainable(trainer.model)

    trainer.resume_or_load(resume=False)
    trainer.train()

    assert trainer.iter == MAX_ITER and len(record.losses) == MAX_ITER
    expected = RPN_AND_BOX_LOSSES | ({"loss_mask"} if mask else set())
    for losses in record.losses:
        assert set(losses) == expected
        assert all(math.isfinite(v) for v in losses.values()), losses
    assert all(torch.isfinite(v).all() for v in weights(trainer.model).values())
    after = trainable(trainer.model)
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert any(k.startswith("backbone.") for k in changed)
    assert any(k.startswith("roi_heads.") for k in changed)
    if mask:
        assert any(k.startswith("roi_heads.mask_head.") for k in changed)
    scaler = trainer.loop.grad_scaler
    if amp == "float16":
        # a step whose gradients overflowed is skipped and halves the scale (from 2^16):
        # at least one of the MAX_ITER steps was applied
        assert scaler is not None and scaler.get_scale() > 2.0**16 / 2**MAX_ITER
    else:
        assert scaler is None

