"""Sync-BN on CUDA: a "SyncBN" config keeps torch's ``nn.SyncBatchNorm`` (not the CPU
replacement) and trains through largedet's Trainer in a one-process NCCL group; torch's
synchronized BN kernels, with their NCCL all-gather, compute plain BN."""

import copy
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import largedet  # noqa: F401
from detectron2.config import get_cfg
from detectron2.layers import NaiveSyncBatchNorm
from detectron2.utils import comm
from largedet.config import add_largedet_config
from largedet.engine import Trainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def syncbn_shapes_cfg(output_dir):
    """The shapes Faster R-CNN R18-FPN with Sync-BN in backbone and FPN, on tiny_shapes at
    128 px, 2 micro-batches of 2 images per step, 3 steps, SGD."""
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(CONFIGS, "shapes", "Base-Shapes-R18-FPN.yaml"))
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", "cuda",
            "MODEL.RESNETS.NORM", "SyncBN", "MODEL.FPN.NORM", "SyncBN",
            "DATASETS.TRAIN", "('tiny_shapes_train',)", "DATASETS.TEST", "()",
            "DATALOADER.NUM_WORKERS", "0",
            "SOLVER.IMS_PER_BATCH", "4", "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", "3",
            "SOLVER.BASE_LR", "0.01", "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()",
            "SOLVER.CHECKPOINT_PERIOD", "1000",
            "OUTPUT_DIR", str(output_dir),
        ]
    )  # fmt: skip
    cfg.freeze()
    return cfg


def test_syncbn_config_trains_with_torch_sync_batchnorm_in_an_nccl_group(
    nccl_group, tiny_shapes, tmp_path
):
    assert dist.get_backend() == "nccl" and comm.get_world_size() == 1
    trainer = Trainer(syncbn_shapes_cfg(tmp_path))
    model = trainer.model
    sync = {n: m for n, m in model.named_modules() if type(m) is nn.SyncBatchNorm}
    assert sync, "no nn.SyncBatchNorm: the CUDA choice was not made"
    assert not any(isinstance(m, NaiveSyncBatchNorm) for m in model.modules())
    assert all(m.weight.is_cuda and m.running_mean.is_cuda for m in sync.values())
    assert trainer.plan.batch.accumulation == 2
    before = {n: (m.running_mean.clone(), m.weight.detach().clone()) for n, m in sync.items()}

    trainer.resume_or_load(resume=False)
    trainer.train()

    assert trainer.iter == 3 and math.isfinite(trainer.loop.last_total_loss)
    # batch statistics were computed (running means left 0) and the affine weights trained
    moved_stats = [n for n, m in sync.items() if not torch.equal(m.running_mean, before[n][0])]
    moved_weights = [n for n, m in sync.items() if not torch.equal(m.weight, before[n][1])]
    assert len(moved_stats) == len(sync)
    assert moved_weights


@pytest.mark.parametrize("shape", [(8, 16, 10, 10), (4, 16, 3, 6, 6)], ids=["2d", "3d"])
def test_sync_batchnorm_kernels_over_nccl_equal_batch_norm(nccl_group, no_tf32, shape):
    """torch's synchronized BN, called as nn.SyncBatchNorm calls it on several GPUs
    (statistics all-gathered over the group, the CUDA kernels batch_norm_stats,
    batch_norm_gather_stats_with_counts, batch_norm_elemt and their backward with an
    all-reduce), here over the group of one: it must equal F.batch_norm."""
    from torch.nn.modules._functions import SyncBatchNorm as SyncBatchNormFunction

    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda") * 2 + 0.5
    upstream = torch.randn(shape, device="cuda")  # the loss is sum(upstream * y)
    weight = torch.rand(16, device="cuda") + 0.5
    bias = torch.rand(16, device="cuda") - 0.5
    eps, momentum = 1e-5, 0.1

    def leaves():
        return [t.clone().requires_grad_() for t in (x, weight, bias)]

    xr, wr, br = leaves()
    mean_r, var_r = torch.zeros(16, device="cuda"), torch.ones(16, device="cuda")
    y_ref = F.batch_norm(xr, mean_r, var_r, wr, br, True, momentum, eps)
    (y_ref * upstream).sum().backward()

    xs, ws, bs = leaves()
    mean_s, var_s = torch.zeros(16, device="cuda"), torch.ones(16, device="cuda")
    y = SyncBatchNormFunction.apply(xs, ws, bs, mean_s, var_s, eps, momentum, nccl_group, 1)
    (y * upstream).sum().backward()

    # fp32 statistics reduced in another order (Welford over the batch vs cuDNN): about 1e-6
    # relative; 1e-4 leaves 100x room, while statistics over a wrong set of elements (one
    # sample, one channel's neighbour) are off by O(1).
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(xs.grad, xr.grad, **tol)
    torch.testing.assert_close(ws.grad, wr.grad, **tol)
    torch.testing.assert_close(bs.grad, br.grad, **tol)
    torch.testing.assert_close(mean_s, mean_r, **tol)
    torch.testing.assert_close(var_s, var_r, **tol)
    assert xr.grad.abs().max() > 0.1  # not trivially zero


def test_syncbn_module_equals_bn_in_a_group_of_one(nccl_group, no_tf32):
    """nn.SyncBatchNorm itself in the NCCL group of one (it normalizes locally there): the
    same outputs, gradients and running statistics as nn.BatchNorm2d."""
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(8).cuda()
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(bn))
    assert type(sync) is nn.SyncBatchNorm
    x = torch.randn(4, 8, 5, 5, device="cuda")
    xr, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    bn(xr).square().sum().backward()
    sync(xs).square().sum().backward()
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-5, atol=1e-5)  # the same kernel path
    torch.testing.assert_close(sync.running_var, bn.running_var, rtol=1e-6, atol=1e-6)
