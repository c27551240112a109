"""TSM / TSN / I3D backbones, the head, the classifier, weights and Sync-BN."""

import math
from collections import Counter

import pytest
import torch
import torchvision
from detectron2.config import get_cfg
from detectron2.layers import NaiveSyncBatchNorm
from detectron2.modeling import build_model
from torch.profiler import ProfilerActivity, profile

from largedet_video import add_video_config

pytestmark = pytest.mark.usefixtures("single_thread")
from largedet_video.layers import NaiveSyncBatchNorm3d, convert_sync_batchnorm
from largedet_video.modeling import (
    I3D_VARIANTS,
    VIDEO_BACKBONE_REGISTRY,
    ClassificationHead,
    ResNet2D,
    ResNet3D,
    load_imagenet_weights,
    temporal_shift,
)


def video_cfg(**model):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.VIDEO.NUM_CLASSES = 5
    cfg.MODEL.VIDEO.RESNET.DEPTH = 10
    cfg.MODEL.VIDEO.RESNET.WIDTH = 8
    for key, value in model.items():
        cfg.merge_from_list([key, value])
    return cfg


def num_params(module):
    return sum(p.numel() for p in module.parameters())


def test_registry_holds_the_backbones():
    assert {"TSMResNet", "TSNResNet", "I3DResNet"} <= set(VIDEO_BACKBONE_REGISTRY._obj_map)


# What the shift's forward and backward may run: allocate, view, copy, fill with zeros.
MEMORY_OPS = {
    "aten::empty_like", "aten::empty_strided", "aten::view", "aten::slice", "aten::as_strided",
    "aten::copy_", "aten::fill_", "aten::lift_fresh",
}  # fmt: skip
SHIFT_EVENTS = ("_TemporalShiftFn", "_TemporalShiftFnBackward")


def profiled(fn):
    """torch.profiler's CPU events of ``fn()``, with input shapes, memory and FLOPs."""
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_flops=True
    ) as prof:
        fn()
    return prof.events()


def under(event):
    """The events ``event`` called, at any depth."""
    for child in event.cpu_children:
        yield child
        yield from under(child)


def split_shift_ops(events):
    """([(shift event, the aten ops inside it)] for each forward and backward of the shift;
    every other aten op). fvcore counts an ``autograd.Function`` as zero FLOPs whatever it
    does, so the shift is checked on the ops it runs instead."""
    calls = [(e, list(under(e))) for e in events if e.name in SHIFT_EVENTS]
    inside = {id(e) for _, call in calls for e in call}
    rest = [e for e in events if e.name.startswith("aten::") and id(e) not in inside]
    return [(e, [op for op in call if op.name.startswith("aten::")]) for e, call in calls], rest


def assert_moves_memory_only(shift, ops):
    """The ``ops`` of one ``shift`` event (forward or backward) allocate one float32 tensor of
    its input's shape, write each of its elements once (copies and zero fills), and do no
    arithmetic."""
    numel = math.prod(shift.input_shapes[0])
    assert {e.name for e in ops} <= MEMORY_OPS, {e.name for e in ops} - MEMORY_OPS
    allocated = sum(e.self_cpu_memory_usage for e in ops if e.self_cpu_memory_usage > 0)
    assert allocated == numel * 4
    writes = ("aten::copy_", "aten::fill_")  # a fill_ runs a copy_ of its own: count it once
    written = [
        math.prod(e.input_shapes[0])
        for e in ops
        if e.name in writes and not (e.cpu_parent and e.cpu_parent.name in writes)
    ]
    assert sum(written) == numel
    assert sum(e.flops for e in ops) == 0


def test_the_shift_only_moves_memory():
    x = torch.randn(2 * 4, 16, 5, 5, requires_grad=True)
    grad_out = torch.randn_like(x)
    events = profiled(lambda: torch.autograd.grad(temporal_shift(x, 4, 8), x, grad_out))
    calls, rest = split_shift_ops(events)
    assert [e.name for e, _ in calls] == list(SHIFT_EVENTS)
    for shift, ops in calls:
        assert shift.input_shapes[0] == list(x.shape)
        assert_moves_memory_only(shift, ops)
    assert rest == []


@pytest.mark.parametrize("depth", [18, 50])
def test_tsm_adds_no_parameters_and_no_arithmetic(depth):
    tsm = ResNet2D(depth=depth, width=16, shift_div=8)
    tsn = ResNet2D(depth=depth, width=16, shift_div=0)
    assert num_params(tsm) == num_params(tsn)
    assert list(tsm.state_dict()) == list(tsn.state_dict())
    tsn.load_state_dict(tsm.state_dict())
    clip = torch.randn(2, 4, 3, 32, 32)
    tsm_shifts, tsm_ops = split_shift_ops(profiled(lambda: tsm(clip).sum().backward()))
    tsn_shifts, tsn_ops = split_shift_ops(profiled(lambda: tsn(clip).sum().backward()))
    # Besides its shifts (forward and backward in each shifted block), TSM runs exactly
    # TSN's ops on the same shapes: the same FLOPs.
    blocks = sum(blk.shift_div > 0 for stage in tsm.stages for blk in stage)
    assert len(tsm_shifts) == 2 * blocks and tsn_shifts == []
    for shift, ops in tsm_shifts:
        assert_moves_memory_only(shift, ops)

    def signature(ops):
        return Counter((e.name, str(e.input_shapes)) for e in ops)

    assert signature(tsm_ops) == signature(tsn_ops)
    assert sum(e.flops for e in tsm_ops) == sum(e.flops for e in tsn_ops) > 0


def test_shift_placement_every_block_then_every_other_block():
    def shifted(net):
        return [[blk.shift_div for blk in stage] for stage in net.stages]

    assert shifted(ResNet2D(depth=50, width=8)) == [[8] * 3, [8] * 4, [8] * 6, [8] * 3]
    r101 = shifted(ResNet2D(depth=101, width=8))
    assert r101[2] == [8 if i % 2 == 0 else 0 for i in range(23)]
    assert sum(d > 0 for stage in r101 for d in stage) == 2 + 2 + 12 + 2
    assert shifted(ResNet2D(depth=18, width=8, shift_div=0)) == [[0, 0]] * 4


def test_shift_is_on_the_residual_branch_before_the_first_conv():
    net = ResNet2D(depth=50, width=8, shift_div=8).eval()
    block = net.layer1[1]  # identity shortcut
    x = torch.randn(2 * 4, 32, 6, 6)
    branch = temporal_shift(x, 4, 8)
    branch = block.relu(block.bn1(block.conv1(branch)))
    branch = block.relu(block.bn2(block.conv2(branch)))
    expected = block.relu(block.bn3(block.conv3(branch)) + x)
    assert torch.allclose(block(x, 4), expected, atol=1e-6)


def test_only_tsm_mixes_information_across_frames():
    torch.manual_seed(0)
    clip = torch.randn(1, 4, 3, 32, 32)
    changed = clip.clone()
    changed[0, 2] += 1.0  # perturb frame 2 only
    for shift_div, other_frames_change in ((8, True), (0, False)):
        net = ResNet2D(depth=10, width=16, shift_div=shift_div).eval()
        with torch.no_grad():
            a, b = net(clip), net(changed)
        diff = (a - b).abs().flatten(1).amax(dim=1)  # per frame
        assert diff[2] > 0
        assert bool((diff[[0, 1, 3]] > 0).all()) == other_frames_change


@pytest.mark.parametrize("variant,out_t", [("3x3x3", 2), ("3x1x1", 8)])
def test_i3d_variants_shapes_and_kernels(variant, out_t):
    net = ResNet3D(I3D_VARIANTS[variant], depth=50, width=8).eval()
    with torch.no_grad():
        out = net(torch.randn(1, 8, 3, 32, 32))
    assert out.shape == (1, 32 * 8, out_t, 1, 1)
    spec = I3D_VARIANTS[variant]
    assert net.conv1.kernel_size == (spec.stem_t, 7, 7)
    assert net.layer1[0].conv2.kernel_size == (spec.conv2_t[0], 3, 3)
    assert net.layer4[0].conv1.kernel_size == (spec.conv1_t[3], 1, 1)


def test_head_is_the_average_of_per_frame_scores():
    head = ClassificationHead(6, 3, dropout=0.5).eval()
    feats = torch.randn(2 * 4, 6, 3, 3)
    per_frame = head.fc(feats.mean(dim=(2, 3))).view(2, 4, 3)
    assert torch.allclose(head(feats, 2), per_frame.mean(dim=1), atol=1e-6)
    feats3d = torch.randn(2, 6, 2, 3, 3)
    assert torch.allclose(head(feats3d, 2), head.fc(feats3d.mean(dim=(2, 3, 4))), atol=1e-6)


def test_classifier_train_loss_and_view_averaged_scores():
    torch.manual_seed(0)
    model = build_model(video_cfg())
    clips = torch.randint(0, 256, (2, 3, 4, 3, 32, 32), dtype=torch.uint8)  # N, V, T, C, H, W
    from detectron2.utils.events import EventStorage

    with EventStorage():
        losses = model({"clip": clips[:, 0], "label": torch.tensor([1, 4])})
    assert set(losses) == {"loss_cls"} and losses["loss_cls"].requires_grad
    model.eval()
    with torch.no_grad():
        scores = model({"clip": clips})["scores"]
        per_view = torch.stack([model({"clip": clips[:, v]})["scores"] for v in range(3)], dim=1)
    assert scores.shape == (2, 5)
    assert torch.allclose(scores, per_view.mean(dim=1), atol=1e-6)
    assert torch.allclose(scores.sum(dim=1), torch.ones(2), atol=1e-5)


def test_imagenet_weights_load_and_inflate(tmp_path):
    path = str(tmp_path / "resnet50.pth")
    ref = torchvision.models.resnet50()
    torch.save(ref.state_dict(), path)
    ref_state = ref.state_dict()

    tsm = ResNet2D(depth=50, shift_div=8)
    load_imagenet_weights(tsm, path)
    for name, value in tsm.state_dict().items():
        assert torch.equal(value, ref_state[name]), name

    i3d = ResNet3D(I3D_VARIANTS["3x3x3"], depth=50)
    load_imagenet_weights(i3d, path)
    w3d = i3d.state_dict()["layer2.1.conv2.weight"]
    assert w3d.shape[2] == 3
    assert torch.allclose(w3d.sum(dim=2), ref_state["layer2.1.conv2.weight"], atol=1e-6)
    assert torch.equal(
        i3d.state_dict()["layer3.0.bn1.running_var"], ref_state["layer3.0.bn1.running_var"]
    )

    torch.save({"unrelated.weight": torch.zeros(1)}, str(tmp_path / "bad.pth"))
    with pytest.raises(ValueError, match="No tensor"):
        load_imagenet_weights(tsm, str(tmp_path / "bad.pth"))


def test_sync_bn_conversion_on_cpu_keeps_state_and_output():
    torch.manual_seed(0)
    net = ResNet3D(I3D_VARIANTS["3x1x1"], depth=50, width=8).eval()
    clip = torch.randn(1, 4, 3, 32, 32)
    with torch.no_grad():
        before = net(clip)
    converted = convert_sync_batchnorm(net, "cpu")
    assert isinstance(converted.bn1, NaiveSyncBatchNorm3d)
    assert not any(type(m) is torch.nn.BatchNorm3d for m in converted.modules())
    with torch.no_grad():
        assert torch.equal(converted(clip), before)
    tsm = convert_sync_batchnorm(ResNet2D(depth=10, width=8), "cpu")
    assert isinstance(tsm.layer1[0].bn1, NaiveSyncBatchNorm)


def test_syncbn_config_builds_and_bad_norm_fails():
    model = build_model(video_cfg(**{"MODEL.VIDEO.NORM": "SyncBN"}))
    assert isinstance(model.backbone.bn1, NaiveSyncBatchNorm)
    with pytest.raises(ValueError, match="MODEL.VIDEO.NORM"):
        build_model(video_cfg(**{"MODEL.VIDEO.NORM": "GN"}))
