"""Sub-batch BN: equal to separate BN over each group (outputs and gradients),
merged running statistics equal to full-batch statistics, conversion, grouping,
and the synchronized path across processes (gloo)."""

import copy
import os
import tempfile
from collections import OrderedDict

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fvcore.nn.precise_bn import update_bn_stats
from torch import nn

from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d
from detectron2.utils.events import EventStorage

from largedet_video import add_video_config
from largedet_video.layers import subbatch_bn
from largedet_video.layers import (
    BNGrouping,
    NaiveSyncBatchNorm3d,
    SubBatchNorm2d,
    SubBatchNorm3d,
    SubBatchNormNd,
    bn_grouping,
    convert_from_subbatch_bn,
    convert_to_subbatch_bn,
    set_bn_grouping,
)
from largedet_video.modeling import ClassificationHead, VideoClassifier


def _random_affine(bn):
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def _input(*shape):
    # Per-sample offsets so that group means differ from the batch mean.
    x = torch.randn(*shape, dtype=torch.float64) * 2
    x += torch.arange(shape[0], dtype=torch.float64).view(-1, *[1] * (len(shape) - 1))
    return x.requires_grad_()


@pytest.mark.parametrize(
    "sub_cls, bn_cls, shape",
    [
        (SubBatchNorm2d, nn.BatchNorm2d, (12, 3, 4, 5)),
        (SubBatchNorm3d, nn.BatchNorm3d, (6, 3, 2, 4, 5)),
        (SubBatchNormNd, nn.BatchNorm1d, (12, 3)),
        (SubBatchNormNd, nn.BatchNorm2d, (12, 3, 4, 5)),
        (SubBatchNormNd, nn.BatchNorm3d, (6, 3, 2, 4, 5)),
        # groups of at least SLICED_MIN_VALUES values per channel: normalized slice by slice
        (SubBatchNorm2d, nn.BatchNorm2d, (12, 3, 8, 8)),
        (SubBatchNorm3d, nn.BatchNorm3d, (6, 3, 4, 8, 8)),
    ],
)
@pytest.mark.parametrize("num_splits", [1, 2, 3])
def test_equals_separate_bn_per_group(sub_cls, bn_cls, shape, num_splits):
    torch.manual_seed(0)
    sub = _random_affine(sub_cls(3, num_splits=num_splits).double())
    refs = [bn_cls(3).double() for _ in range(num_splits)]
    for ref in refs:
        ref.load_state_dict(sub.state_dict())
    x = _input(*shape)
    x_ref = x.detach().clone().requires_grad_()
    upstream = torch.randn(shape, dtype=torch.float64)

    y = sub(x)
    y_ref = torch.cat([bn(part) for bn, part in zip(refs, x_ref.chunk(num_splits))])
    torch.testing.assert_close(y, y_ref)
    (y * upstream).sum().backward()
    (y_ref * upstream).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    # One shared affine: its gradient is the sum over the groups'.
    torch.testing.assert_close(sub.weight.grad, sum(bn.weight.grad for bn in refs))
    torch.testing.assert_close(sub.bias.grad, sum(bn.bias.grad for bn in refs))


@pytest.mark.parametrize("num_splits", [2, 4, 16])
def test_both_layouts_give_the_same_outputs_gradients_and_statistics(monkeypatch, num_splits):
    """Groups as slices of the batch (few groups of many values: here 16 x 8 x 8 values per
    channel each) and groups moved into channels (forced by SLICED_MAX_GROUPS = 0)."""
    torch.manual_seed(0)
    sub = _random_affine(SubBatchNorm2d(3, num_splits=num_splits).double())
    assert 16 * 8 * 8 >= subbatch_bn.SLICED_MIN_VALUES and num_splits <= subbatch_bn.SLICED_MAX_GROUPS
    data = _input(16 * num_splits, 3, 8, 8).detach()
    results = []
    for max_groups in (subbatch_bn.SLICED_MAX_GROUPS, 0):
        monkeypatch.setattr(subbatch_bn, "SLICED_MAX_GROUPS", max_groups)
        bn = copy.deepcopy(sub)
        x = data.clone().requires_grad_()
        y = bn(x)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        results.append((y, x.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var))
    for sliced, moved in zip(*results):
        torch.testing.assert_close(sliced, moved)


def test_tsm_layout_groups_whole_clips():
    # TSM's (N*T, C, H, W): 4 clips of 3 frames in 2 groups = rows 0-5 and 6-11.
    torch.manual_seed(0)
    sub = _random_affine(SubBatchNorm2d(3, num_splits=2).double())
    clips = _input(4, 3, 3, 4, 4)  # (N, T, C, H, W)
    y = sub(clips.reshape(12, 3, 4, 4)).reshape(4, 3, 3, 4, 4)
    for group in (slice(0, 2), slice(2, 4)):
        part = clips[group].reshape(6, 3, 4, 4)
        mean = part.mean(dim=(0, 2, 3), keepdim=True)
        var = part.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
        expected = (part - mean) / torch.sqrt(var + sub.eps) * sub.weight.view(1, 3, 1, 1)
        expected = expected + sub.bias.view(1, 3, 1, 1)
        torch.testing.assert_close(y[group].reshape(6, 3, 4, 4), expected)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_merged_running_stats_equal_full_batch_bn(momentum):
    # Mean of group means = batch mean; mean of group variances + variance of
    # group means = batch variance (law of total variance), Bessel-corrected
    # over the whole batch: what nn.BatchNorm2d accumulates over the same batches.
    torch.manual_seed(0)
    sub = SubBatchNorm2d(3, num_splits=4, momentum=momentum).double()
    full = nn.BatchNorm2d(3, momentum=momentum).double()
    for _ in range(3):
        x = _input(8, 3, 5, 5).detach()
        sub(x)
        full(x)
    torch.testing.assert_close(sub.running_mean, full.running_mean)
    torch.testing.assert_close(sub.running_var, full.running_var)
    assert sub.num_batches_tracked.item() == full.num_batches_tracked.item() == 3
    # Evaluation uses the one merged set, exactly as plain BN does.
    sub.eval()
    full.eval()
    x = _input(5, 3, 5, 5).detach()
    torch.testing.assert_close(sub(x), full(x))


def test_precise_bn_sees_a_batchnorm():
    # fvcore's update_bn_stats finds the layers (they are nn.BatchNorm2d) and,
    # with merged per-batch statistics, computes the full-batch population.
    torch.manual_seed(0)
    batches = [_input(8, 3, 4, 4).detach() for _ in range(3)]
    sub = SubBatchNorm2d(3, num_splits=2).double()
    full = nn.BatchNorm2d(3).double()
    update_bn_stats(sub, batches, num_iters=3)
    update_bn_stats(full, batches, num_iters=3)
    torch.testing.assert_close(sub.running_mean, full.running_mean)
    torch.testing.assert_close(sub.running_var, full.running_var)


def test_indivisible_batch_raises():
    with pytest.raises(ValueError, match="equal BN groups"):
        SubBatchNorm2d(3, num_splits=4)(torch.randn(6, 3, 2, 2))


def test_half_precision_input_keeps_dtype():
    sub = SubBatchNorm2d(3, num_splits=2)
    x = torch.randn(4, 3, 4, 4)
    y = sub(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), sub(x), atol=0.05, rtol=0.02)


@pytest.mark.parametrize(
    "clips, group, world, expected",
    [
        (8, 8, 1, BNGrouping(1, 1)),
        (32, 8, 1, BNGrouping(4, 1)),  # 32 // 8 = 4 groups of 8
        (12, 8, 4, BNGrouping(1, 1)),  # 12 // 8 = 1 group of 12
        (20, 8, 1, BNGrouping(2, 1)),  # 20 // 8 = 2 groups of 10
        (17, 8, 1, BNGrouping(1, 1)),  # 17 // 8 = 2 does not divide 17 -> 1
        (4, 8, 1, BNGrouping(1, 1)),  # one device: the 4 clips alone
        (4, 8, 8, BNGrouping(1, 2)),  # 2 devices x 4 = 8
        (2, 8, 8, BNGrouping(1, 4)),  # 4 devices x 2 = 8
        (3, 8, 8, BNGrouping(1, 4)),  # 3 x 3 >= 8 but 3 does not divide 8 -> 4
        (1, 8, 2, BNGrouping(1, 2)),  # not enough devices: all of them
    ],
)
def test_bn_grouping(clips, group, world, expected):
    assert bn_grouping(clips, group, world) == expected


def test_grouping_validation():
    with pytest.raises(ValueError):
        BNGrouping(2, 2)
    with pytest.raises(ValueError):
        BNGrouping(0, 1)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn2d = nn.BatchNorm2d(4)
        self.frozen = FrozenBatchNorm2d(4)
        self.head = nn.Sequential(nn.Conv3d(4, 4, 1), nn.BatchNorm3d(4), NaiveSyncBatchNorm3d(4))

    def forward(self, x):  # x: (N, T, 3, H, W)
        n, t = x.shape[:2]
        y = self.frozen(self.bn2d(self.conv(x.flatten(0, 1))))
        return self.head(y.view(n, t, 4, *y.shape[2:]).transpose(1, 2))


def test_convert_and_back_shares_parameters():
    torch.manual_seed(0)
    net = _Net()
    for bn in (net.bn2d, net.head[1], net.head[2]):
        _random_affine(bn)
        bn.running_mean.uniform_()
    params_before = list(net.parameters())
    state_before = {k: v.clone() for k, v in net.state_dict().items()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    convert_to_subbatch_bn(net, BNGrouping(num_splits=2))
    assert type(net.bn2d) is SubBatchNorm2d
    assert type(net.head[1]) is SubBatchNorm3d
    assert type(net.head[2]) is SubBatchNorm3d  # NaiveSyncBatchNorm3d takes 5D inputs
    assert type(net.frozen) is FrozenBatchNorm2d
    # The very same parameter objects: the optimizer keeps working on them.
    assert all(a is b for a, b in zip(net.parameters(), params_before))
    assert net.state_dict().keys() == state_before.keys()
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, state_before[k])

    net(torch.randn(4, 2, 3, 3, 3)).sum().backward()  # 4 clips, 2 groups
    optimizer.step()
    assert set_bn_grouping(net, BNGrouping(num_splits=4)) == 3
    assert net.bn2d.num_splits == net.head[2].num_splits == 4
    with pytest.raises(ValueError, match="equal BN groups"):
        net(torch.randn(6, 2, 3, 3, 3))

    stats = {k: v.clone() for k, v in net.state_dict().items()}
    convert_from_subbatch_bn(net)
    assert type(net.bn2d) is nn.BatchNorm2d
    assert type(net.head[1]) is nn.BatchNorm3d and type(net.head[2]) is nn.BatchNorm3d
    assert all(a is b for a, b in zip(net.parameters(), params_before))
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, stats[k])


def test_convert_root_module():
    bn = nn.BatchNorm3d(5).eval()
    sub = convert_to_subbatch_bn(bn, BNGrouping(num_splits=3))
    assert type(sub) is SubBatchNorm3d and sub.num_splits == 3 and not sub.training
    assert sub.weight is bn.weight and sub.running_var is bn.running_var


def test_syncbn_becomes_subbatch_bn_of_any_rank():
    """MODEL.VIDEO.NORM "SyncBN" on GPUs builds nn.SyncBatchNorm (built and converted here on
    the CPU): it becomes SubBatchNormNd, grouped like the others, the same function."""
    torch.manual_seed(0)
    plain = _Net()
    for bn in (plain.bn2d, plain.head[1], plain.head[2]):
        _random_affine(bn)
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    assert [type(m) for m in (synced.bn2d, synced.head[1], synced.head[2])] == [nn.SyncBatchNorm] * 3
    params_before = list(synced.parameters())

    convert_to_subbatch_bn(synced, BNGrouping(num_splits=2))
    convert_to_subbatch_bn(plain, BNGrouping(num_splits=2))
    assert [type(m) for m in (synced.bn2d, synced.head[1], synced.head[2])] == [SubBatchNormNd] * 3
    assert type(synced.frozen) is FrozenBatchNorm2d
    assert all(a is b for a, b in zip(synced.parameters(), params_before))
    assert set_bn_grouping(synced, BNGrouping(num_splits=4)) == 3
    set_bn_grouping(plain, BNGrouping(num_splits=4))
    x = torch.randn(8, 2, 3, 3, 3)  # 8 clips of 2 frames, 4 groups
    torch.testing.assert_close(synced(x), plain(x))
    torch.testing.assert_close(synced.head[1].running_var, plain.head[1].running_var)

    convert_from_subbatch_bn(synced)
    assert [type(m) for m in (synced.bn2d, synced.head[1], synced.head[2])] == [nn.SyncBatchNorm] * 3
    assert all(a is b for a, b in zip(synced.parameters(), params_before))


def test_batch_norms_it_cannot_take_over_are_named():
    net = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), head=nn.Sequential(nn.BatchNorm1d(3))))
    with pytest.raises(ValueError, match=r"head\.0 \(BatchNorm1d\)"):
        convert_to_subbatch_bn(net)
    own_group = nn.SyncBatchNorm(3, process_group=object())  # any non-default group
    with pytest.raises(ValueError, match="bn .*own process group"):
        convert_to_subbatch_bn(nn.Sequential(OrderedDict(bn=own_group)))


def _video_cfg(**options):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.MODEL.VIDEO.NUM_CLASSES = 5
    cfg.MODEL.VIDEO.RESNET.DEPTH = 10
    cfg.MODEL.VIDEO.RESNET.WIDTH = 8
    cfg.MULTIGRID.LONG_CYCLE = True
    cfg.MULTIGRID.BN_BASE_SIZE = 2
    cfg.merge_from_list([str(x) for pair in options.items() for x in pair])
    return cfg


def test_multigrid_model_groups_gpu_syncbn(single_thread):
    """Multigrid with MODEL.VIDEO.NORM SyncBN on a GPU: every backbone BN is an nn.SyncBatchNorm,
    and every one becomes sub-batch BN and is regrouped for each training batch. Only the norm
    conversion reads MODEL.DEVICE: the model itself stays on the CPU here."""
    model = VideoClassifier(_video_cfg(**{"MODEL.DEVICE": "cuda", "MODEL.VIDEO.NORM": "SyncBN"}))
    bns = [m for m in model.backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    # ResNet-10: the stem's, 2 in each of the 4 stages' basic block, the shortcuts' of stages 2-4
    assert len(bns) == 1 + 4 * 2 + 3
    assert all(type(m) is SubBatchNormNd for m in bns)
    model.train()
    clips = torch.randint(0, 255, (4, 2, 3, 32, 32), dtype=torch.uint8)
    with EventStorage():
        model({"clip": clips, "label": torch.tensor([0, 1, 2, 3])})
    assert {m.grouping for m in bns} == {BNGrouping(num_splits=2)}  # 4 clips in groups of 2


def test_multigrid_model_without_batch_norm_is_refused():
    backbone = nn.Sequential(nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4))
    backbone.out_channels = 4
    with pytest.raises(ValueError, match="MULTIGRID.BN_BASE_SIZE 8 .*no batch norm"):
        VideoClassifier(
            backbone=backbone, head=ClassificationHead(4, 5, 0.0), pixel_mean=[0.0] * 3,
            pixel_std=[1.0] * 3, bn_group_size=8,
        )  # fmt: skip
    with_bn1d = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 1), bn=nn.BatchNorm1d(4)))
    with_bn1d.out_channels = 4
    with pytest.raises(ValueError, match=r"MULTIGRID.BN_BASE_SIZE 8 .*bn \(BatchNorm1d\)"):
        VideoClassifier(
            backbone=with_bn1d, head=ClassificationHead(4, 5, 0.0), pixel_mean=[0.0] * 3,
            pixel_std=[1.0] * 3, bn_group_size=8,
        )  # fmt: skip


def _sync_worker(rank, world_size, init_file, x, upstream, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        torch.manual_seed(0)
        sub = _random_affine(SubBatchNorm2d(3, num_sync_devices=2).double())
        clips = x.shape[0] // world_size
        local = x[rank * clips : (rank + 1) * clips].clone().requires_grad_()
        part = slice(rank * clips, (rank + 1) * clips)
        y = sub(local)
        (y * upstream[part]).sum().backward()
        torch.save(
            dict(y=y.detach(), grad=local.grad, weight_grad=sub.weight.grad,
                 running_mean=sub.running_mean, running_var=sub.running_var),
            os.path.join(out_dir, f"{rank}.pt"),
        )  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_sync_across_devices_equals_bn_over_their_clips():
    # 4 processes with 2 clips each, groups of 4 clips -> 2 sync devices:
    # ranks {0, 1} normalize clips 0-3 together, ranks {2, 3} clips 4-7; the same
    # as one process with all 8 clips in 2 sub-batches.
    torch.manual_seed(1)
    x = _input(8, 3, 3, 3).detach()
    upstream = torch.randn(x.shape, dtype=torch.float64)
    with tempfile.TemporaryDirectory() as tmp:
        # Forked workers reuse this process's imports (spawned ones would
        # re-import torch and Detectron2, several seconds each).
        mp.start_processes(
            _sync_worker,
            args=(4, os.path.join(tmp, "init"), x, upstream, tmp),
            nprocs=4,
            start_method="fork",
        )
        results = [torch.load(os.path.join(tmp, f"{r}.pt")) for r in range(4)]

    torch.manual_seed(0)
    ref = _random_affine(SubBatchNorm2d(3, num_splits=2).double())
    xr = x.clone().requires_grad_()
    y = ref(xr)
    (y * upstream).sum().backward()
    torch.testing.assert_close(torch.cat([r["y"] for r in results]), y.detach())
    torch.testing.assert_close(torch.cat([r["grad"] for r in results]), xr.grad)
    torch.testing.assert_close(sum(r["weight_grad"] for r in results), ref.weight.grad)
    # Running statistics: BN over each sync group's 4 clips.
    for group in (0, 1):
        bn = nn.BatchNorm2d(3).double()
        bn(x[4 * group : 4 * group + 4])
        for r in results[2 * group : 2 * group + 2]:
            torch.testing.assert_close(r["running_mean"], bn.running_mean)
            torch.testing.assert_close(r["running_var"], bn.running_var)


def test_a_batch_norm_without_bias_converts_without_one():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, bias=False)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
    sub = convert_to_subbatch_bn(copy.deepcopy(bn), BNGrouping(num_splits=2))
    assert type(sub) is SubBatchNorm2d and sub.bias is None
    assert [name for name, _ in sub.named_parameters()] == ["weight"]
    # each half of the batch normalized on its own, scaled, no shift
    x = torch.randn(4, 3, 5, 5)
    expected = torch.cat([bn.train()(half) for half in (x[:2], x[2:])])
    torch.testing.assert_close(sub.train()(x), expected)
    back = convert_from_subbatch_bn(sub)
    assert type(back) is nn.BatchNorm2d and back.bias is None
