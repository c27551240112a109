"""The fallback for detectron2._C: clear errors for compiled-only ops, normal introspection."""

import subprocess
import sys
import textwrap

import pytest
import torch

import largedet
from largedet.utils.d2_compat import FALLBACK_MARKER, MissingCompiledOpError, ensure_detectron2_ops

needs_fallback = pytest.mark.skipif(largedet.HAS_COMPILED_D2_OPS, reason="a compiled Detectron2 is installed")


@needs_fallback
def test_fallback_module_behaves_like_a_module():
    import detectron2._C as ext

    assert getattr(ext, FALLBACK_MARKER)
    assert not hasattr(ext, "__file__")  # introspection: AttributeError, as on any module
    with pytest.raises(AttributeError):
        ext.__path__  # noqa: B018
    assert ext.has_cuda() is False
    assert "not built" in ext.get_compiler_version()
    assert ensure_detectron2_ops() is False  # idempotent


@needs_fallback
def test_rotated_nms_names_the_missing_extension():
    from detectron2.layers import nms_rotated

    boxes = torch.tensor([[5.0, 5.0, 4.0, 4.0, 0.0], [5.0, 5.0, 4.0, 4.0, 10.0]])
    with pytest.raises(MissingCompiledOpError, match=r"detectron2\._C.*nms_rotated.*build Detectron2 from source"):
        nms_rotated(boxes, torch.tensor([0.9, 0.8]), 0.5)


@needs_fallback
def test_rotated_box_iou_names_the_missing_extension():
    from detectron2.layers.rotated_boxes import pairwise_iou_rotated

    boxes = torch.tensor([[5.0, 5.0, 4.0, 4.0, 0.0]])
    with pytest.raises(MissingCompiledOpError, match="box_iou_rotated"):
        pairwise_iou_rotated(boxes, boxes)


@needs_fallback
def test_deformable_conv_names_the_missing_extension():
    """On GPUs Detectron2's deformable convolutions call detectron2._C directly."""
    from detectron2.layers import deform_conv

    assert getattr(deform_conv._C, FALLBACK_MARKER)
    with pytest.raises(MissingCompiledOpError, match="deform_conv_forward"):
        deform_conv._C.deform_conv_forward(torch.zeros(1))
    with pytest.raises(MissingCompiledOpError, match="modulated_deform_conv_forward"):
        deform_conv._C.modulated_deform_conv_forward(torch.zeros(1))


def test_deformable_conv_on_cpu_runs_through_torchvision():
    """On the CPU, Detectron2's DeformConv needs no compiled extension: it is torchvision's op."""
    import torchvision
    from detectron2.layers import DeformConv

    torch.manual_seed(0)
    conv = DeformConv(4, 6, kernel_size=3, padding=1, bias=False)
    x = torch.randn(1, 4, 8, 8)
    offset = torch.randn(1, 18, 8, 8)
    expected = torchvision.ops.deform_conv2d(x, offset, conv.weight, padding=1)
    torch.testing.assert_close(conv(x, offset), expected)


def test_a_working_extension_is_left_alone(tmp_path):
    """Where detectron2._C imports, ensure_detectron2_ops installs nothing."""
    fake = tmp_path / "fake_ext"
    (fake / "detectron2").mkdir(parents=True)
    # a stand-in package "detectron2" whose _C imports fine
    (fake / "detectron2" / "__init__.py").write_text("")
    (fake / "detectron2" / "_C.py").write_text("REAL = True\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(fake)!r})
        from largedet.utils.d2_compat import ensure_detectron2_ops, FALLBACK_MARKER
        assert ensure_detectron2_ops() is True
        import detectron2._C as ext
        assert ext.REAL and not hasattr(ext, FALLBACK_MARKER)
        import torch
        assert not hasattr(torch.ops.detectron2, "nms_rotated")
        print("left alone")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "left alone" in out.stdout
