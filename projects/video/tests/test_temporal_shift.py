"""The shift against a loop over its definition (values and gradients)."""

import pytest
import torch

from largedet_video.modeling import TemporalShift, temporal_shift


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
