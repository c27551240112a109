"""The shift against a loop over its definition (values and gradients), and each of its
implementations against the default one."""

import os
import subprocess
import sys

import pytest
import torch
from detectron2.config import get_cfg

from largedet_video import add_video_config
from largedet_video.modeling import ResNet2D, TemporalShift, build_video_backbone, temporal_shift
from largedet_video.modeling.temporal_shift import (
    SHIFT_IMPLS,
    _TemporalShiftFn,
    _triton_runs_on,
    _where,
)


def shift_by_definition(x: torch.Tensor, num_segments: int, fold_div: int) -> torch.Tensor:
    """out[n*T + t, c]: from frame t + 1 for c < fold, from frame t - 1 for
    fold <= c < 2 fold, from frame t otherwise; 0 where that frame does not exist."""
    nt, c = x.shape[:2]
    fold = c // fold_div
    rows = []
    for i in range(nt):
        t = i % num_segments
        chans = []
        for ch in range(c):
            src = t + 1 if ch < fold else t - 1 if ch < 2 * fold else t
            if 0 <= src < num_segments:
                chans.append(x[i - t + src, ch])
            else:
                chans.append(torch.zeros_like(x[i, ch]))
        rows.append(torch.stack(chans))
    return torch.stack(rows)


@pytest.mark.parametrize(
    "n,t,c,fold_div", [(2, 5, 17, 8), (3, 4, 16, 4), (1, 8, 64, 8), (2, 1, 8, 8)]
)
def test_values_and_gradients_match_definition(n, t, c, fold_div):
    torch.manual_seed(0)
    x = torch.randn(n * t, c, 3, 2, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out = temporal_shift(x, t, fold_div)
    ref = shift_by_definition(x_ref, t, fold_div)
    assert torch.equal(out, ref)

    grad_out = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, x, grad_out)
    (g_ref,) = torch.autograd.grad(ref, x_ref, grad_out)
    assert torch.equal(g, g_ref)


def test_known_values():
    # One clip of 3 frames, 8 channels, fold 1: channel 0 comes from the next
    # frame, channel 1 from the previous one, channels 2..7 stay.
    x = torch.arange(3 * 8, dtype=torch.float32).view(3, 8, 1, 1) + 1
    out = temporal_shift(x, 3, 8).view(3, 8)
    assert out[:, 0].tolist() == [9.0, 17.0, 0.0]
    assert out[:, 1].tolist() == [0.0, 2.0, 10.0]
    assert torch.equal(out[:, 2:], x.view(3, 8)[:, 2:])


def test_gradcheck_first_and_second_order():
    x = torch.randn(2 * 3, 8, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: temporal_shift(z, 3, 8), (x,))
    assert torch.autograd.gradgradcheck(lambda z: temporal_shift(z, 3, 8), (x,))


def test_channels_last_and_non_contiguous_inputs():
    x = torch.randn(2 * 4, 16, 5, 3)
    ref = shift_by_definition(x, 4, 8)
    cl = x.to(memory_format=torch.channels_last)
    out = temporal_shift(cl, 4)
    assert torch.equal(out, ref)
    assert out.is_contiguous(memory_format=torch.channels_last)
    strided = torch.randn(2 * 4, 16, 5, 6)[..., ::2]
    assert torch.equal(temporal_shift(strided, 4), shift_by_definition(strided, 4, 8))


def test_input_is_not_modified_and_module_has_no_parameters():
    x = torch.randn(8, 16, 2, 2)
    before = x.clone()
    module = TemporalShift(num_segments=4)
    module(x)
    assert torch.equal(x, before)
    assert list(module.parameters()) == []


def test_rejects_batch_not_multiple_of_segments():
    with pytest.raises(ValueError, match="multiple of num_segments"):
        temporal_shift(torch.zeros(7, 8, 1, 1), 4)


# Every implementation against "slices", forward and backward, bit for bit: odd channel
# counts, one frame per clip, a fold divisor of 4, channels-last inputs.
VARIANT_CASES = [(2, 5, 17, 8, False), (1, 1, 8, 8, False), (2, 4, 16, 4, True), (3, 3, 9, 8, True)]


def assert_same_as_slices(shift, n, t, c, fold_div, channels_last, dtype, hw=(3, 2)):
    torch.manual_seed(0)
    x = torch.randn(n * t, c, *hw).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    out, ref = shift(x, t, fold_div), temporal_shift(x, t, fold_div, "slices")
    grad_out = torch.randn_like(ref)
    (g,) = torch.autograd.grad(out, x, grad_out)
    (g_ref,) = torch.autograd.grad(ref, x, grad_out)
    assert torch.equal(out, ref) and torch.equal(g, g_ref)
    assert out.dtype == dtype and out.stride() == ref.stride() and g.stride() == g_ref.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,t,c,fold_div,channels_last", VARIANT_CASES)
def test_compiled_expression_equals_slices(n, t, c, fold_div, channels_last, dtype):
    # the expression "compiled" hands to torch.compile, run eagerly
    def where_shift(x, t, fold_div):
        fold = x.shape[1] // fold_div
        return _TemporalShiftFn.apply(x, t, fold, _where, False)

    assert_same_as_slices(where_shift, n, t, c, fold_div, channels_last, dtype)


def test_compiled_equals_slices():
    # torch.compile on the CPU (Inductor's C++ backend): a few shapes, each direction
    torch._dynamo.reset()
    for n, t, c, fold_div, channels_last in VARIANT_CASES[:2]:
        assert_same_as_slices(
            lambda x, t, d: temporal_shift(x, t, d, "compiled"),
            n, t, c, fold_div, channels_last, torch.float32,
        )  # fmt: skip


TRITON_CHECK = """
import torch
from test_temporal_shift import VARIANT_CASES, assert_same_as_slices
from largedet_video.modeling import temporal_shift
from largedet_video.modeling.temporal_shift import _triton_runs_on
assert _triton_runs_on(torch.zeros(1))
for dtype in (torch.float32, torch.bfloat16):
    for case in VARIANT_CASES + [(2, 3, 1, 8, False), (2, 2, 3, 1, True)]:
        for hw in ((3, 2), (1, 1), (7, 7), (1, 3)):
            shift = lambda x, t, d: temporal_shift(x, t, d, "triton")
            assert_same_as_slices(shift, *case, dtype, hw)
x = torch.randn(2 * 3, 8, 2, 2, dtype=torch.float64, requires_grad=True)
(g,) = torch.autograd.grad(temporal_shift(x, 3, 8, "triton").pow(2).sum(), x, create_graph=True)
(g_ref,) = torch.autograd.grad(temporal_shift(x, 3, 8).pow(2).sum(), x, create_graph=True)
v = torch.randn_like(x)
assert torch.equal(torch.autograd.grad(g, x, v)[0], torch.autograd.grad(g_ref, x, v)[0])
print("triton ok")
"""


def test_triton_equals_slices_in_the_interpreter():
    """The Triton kernel itself, run on the CPU by Triton's interpreter (which must be
    chosen before the kernel is defined, hence a fresh process)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "triton ok" in proc.stdout, proc.stderr[-3000:]


def test_triton_without_a_gpu_runs_the_slices(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not _triton_runs_on(torch.zeros(2))
    assert_same_as_slices(
        lambda x, t, d: temporal_shift(x, t, d, "triton"), 2, 5, 17, 8, False, torch.float32
    )


def test_unknown_implementation_is_an_error():
    with pytest.raises(ValueError, match="Unknown shift implementation 'fast'"):
        temporal_shift(torch.zeros(4, 8, 1, 1), 4, impl="fast")
    with pytest.raises(ValueError, match="shift_impl must be one of"):
        ResNet2D(depth=10, width=8, shift_impl="fast")


def test_backbone_passes_its_implementation_to_every_shifted_block():
    cfg = add_video_config(get_cfg())
    assert cfg.MODEL.VIDEO.TSM.SHIFT_IMPL == "triton"
    cfg.MODEL.VIDEO.RESNET.DEPTH, cfg.MODEL.VIDEO.RESNET.WIDTH = 10, 8
    cfg.MODEL.VIDEO.TSM.SHIFT_IMPL = "compiled"
    net = build_video_backbone(cfg)
    assert {blk.shift_impl for stage in net.stages for blk in stage} == {"compiled"}
    assert set(SHIFT_IMPLS) == {"slices", "triton", "compiled"}
