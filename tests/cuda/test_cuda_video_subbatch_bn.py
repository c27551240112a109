"""Multigrid's sub-batch BN with ``MODEL.VIDEO.NORM SyncBN`` on CUDA: every batch norm of
the backbone (torch's ``nn.SyncBatchNorm`` there) becomes a sub-batch BN, which normalizes
each group of ``MULTIGRID.BN_BASE_SIZE`` clips on its own, and trains (fp32 and bf16)."""

import pytest
import torch
from torch import nn

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage

from largedet_video import add_video_config
from largedet_video.layers import BNGrouping, set_bn_grouping

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GROUP = 4  # MULTIGRID.BN_BASE_SIZE
CLIPS = 2 * GROUP  # one device's batch: two BN groups
FRAMES, SIZE = 4, 32

# Logits of the grouped batch against each group run alone (fp32, TF32 off): the same
# arithmetic up to the reduction order cuDNN picks per batch size, ~1e-6 relative per layer;
# 1e-4 leaves room for a few dozen layers. BN over the whole batch instead of the groups
# moves the logits by far more (checked below, so the comparison can fail).
TOL = dict(rtol=1e-4, atol=1e-4)


def video_cfg(backbone, depth):
    cfg = add_video_config(get_cfg())
    cfg.MODEL.DEVICE = "cuda"
    cfg.MODEL.VIDEO.BACKBONE = backbone
    cfg.MODEL.VIDEO.NORM = "SyncBN"
    cfg.MODEL.VIDEO.NUM_CLASSES = 4
    cfg.MODEL.VIDEO.DROPOUT = 0.0
    cfg.MODEL.VIDEO.RESNET.DEPTH = depth
    cfg.MODEL.VIDEO.RESNET.WIDTH = 8
    cfg.MULTIGRID.LONG_CYCLE = True  # multigrid on: sub-batch BN in the backbone
    cfg.MULTIGRID.BN_BASE_SIZE = GROUP
    return cfg


def batch_norms(module):
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def clips():
    """Two groups of clips with different brightness, so that their BN statistics differ
    from the whole batch's: (CLIPS, FRAMES, 3, SIZE, SIZE) uint8."""
    g = torch.Generator().manual_seed(0)
    dark = torch.randint(0, 128, (GROUP, FRAMES, 3, SIZE, SIZE), generator=g, dtype=torch.uint8)
    bright = torch.randint(128, 256, (GROUP, FRAMES, 3, SIZE, SIZE), generator=g, dtype=torch.uint8)
    return torch.cat([dark, bright])


@pytest.mark.parametrize("backbone, depth", [("TSMResNet", 10), ("I3DResNet", 50)])
def test_sub_batch_bn_takes_over_sync_bn_and_normalizes_each_group(
    nccl_group, no_tf32, backbone, depth
):
    torch.manual_seed(0)
    model = build_model(video_cfg(backbone, depth))
    bns = batch_norms(model.backbone)
    assert bns
    assert not [m for m in bns if type(m) is nn.SyncBatchNorm], "SyncBN was not taken over"
    assert all(hasattr(m, "num_splits") for m in bns), "a batch norm is not a sub-batch BN"
    assert all(m.weight.is_cuda for m in bns)

    batch = {"clip": clips(), "label": torch.tensor([0, 1, 2, 3] * 2)}
    with EventStorage():
        loss = model(batch)["loss_cls"]
    # the model grouped its 8 clips into groups of 4 and trains through them
    assert all(m.num_splits == CLIPS // GROUP for m in bns)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)

    x = model.preprocess(batch["clip"])  # (N, T, 3, H, W) normalized, on the GPU
    with torch.no_grad():
        set_bn_grouping(model.backbone, BNGrouping(num_splits=CLIPS // GROUP))
        grouped = model.logits(x)
        set_bn_grouping(model.backbone, BNGrouping(num_splits=1))
        alone = torch.cat([model.logits(x[:GROUP]), model.logits(x[GROUP:])])
        whole = model.logits(x)
    torch.testing.assert_close(grouped, alone, **TOL)
    assert (whole - alone).abs().max() > 100 * TOL["atol"]


def test_sub_batch_bn_trains_under_bfloat16_autocast(nccl_group):
    torch.manual_seed(0)
    model = build_model(video_cfg("TSMResNet", 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = {"clip": clips(), "label": torch.tensor([0, 1, 2, 3] * 2)}
    losses = []
    for _ in range(3):
        with EventStorage(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch)["loss_cls"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    bn = batch_norms(model.backbone)[0]
    assert bn.running_mean.dtype == torch.float32 and bn.num_batches_tracked.item() == 3
