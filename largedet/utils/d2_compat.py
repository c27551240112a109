"""A fallback for Detectron2's compiled extension ``detectron2._C``.

Detectron2 reaches its C++/CUDA ops two ways: the module ``detectron2._C``
(deformable convolution, the fast COCO evaluator, build information) and the
torch op namespace ``torch.ops.detectron2`` (rotated boxes: ``nms_rotated``,
``box_iou_rotated``, ``roi_align_rotated_*``). Faster and Mask R-CNN need none of
them, so when the compiled extension cannot load (a wheel built for another
Python or torch), :func:`ensure_detectron2_ops` registers stand-ins that raise an
error naming the missing extension and how to get it, only when one is called.
Where ``detectron2._C`` imports, nothing is installed.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types

logger = logging.getLogger(__name__)

FALLBACK_MARKER = "__largedet_fallback__"

_HOW_TO_GET = (
    "Detectron2's compiled extension 'detectron2._C' is not available in this "
    "environment (largedet installed a fallback for it, which covers Faster and "
    "Mask R-CNN). The op '{op}' needs the real extension: build Detectron2 from "
    "source for this Python and torch (clone facebookresearch/detectron2 and run "
    "'python -m pip install -e detectron2'; see Detectron2's INSTALL.md)."
)

# Ops that Detectron2 registers under torch.ops.detectron2, with their schemas.
_TORCH_OP_SCHEMAS = {
    "nms_rotated": "nms_rotated(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",
    "box_iou_rotated": "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "roi_align_rotated_forward": (
        "roi_align_rotated_forward(Tensor input, Tensor rois, float spatial_scale, "
        "int pooled_height, int pooled_width, int sampling_ratio) -> Tensor"
    ),
    "roi_align_rotated_backward": (
        "roi_align_rotated_backward(Tensor grad, Tensor rois, float spatial_scale, "
        "int pooled_height, int pooled_width, int batch_size, int channels, int height, "
        "int width, int sampling_ratio) -> Tensor"
    ),
}

_BUILD_INFO = {
    "get_compiler_version": lambda: "not built (largedet fallback for detectron2._C)",
    "get_cuda_version": lambda: "not built (largedet fallback for detectron2._C)",
    "has_cuda": lambda: False,
}


class MissingCompiledOpError(RuntimeError):
    """Raised when a Detectron2 op that only exists in ``detectron2._C`` is called."""


def _missing_op(name: str):
    def op(*args, **kwargs):
        raise MissingCompiledOpError(_HOW_TO_GET.format(op=name))

    op.__name__ = name
    op.__qualname__ = name
    return op


class _FallbackExtension(types.ModuleType):
    """Stands in for ``detectron2._C``: every public name is an op that raises.

    Dunder and private look-ups raise ``AttributeError`` as on any module, so
    ``hasattr(mod, "__file__")`` and other introspection behave normally.
    """

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        if name in _BUILD_INFO:
            return _BUILD_INFO[name]
        return _missing_op(name)


_torch_library = None  # keeps the fallback op library alive for the process


def _register_torch_ops() -> None:
    global _torch_library
    import torch

    missing = [n for n in _TORCH_OP_SCHEMAS if not _has_torch_op(n)]
    if not missing:
        return
    lib = torch.library.Library("detectron2", "FRAGMENT")
    for name in missing:
        lib.define(_TORCH_OP_SCHEMAS[name])
        lib.impl(name, _missing_op(name), "CompositeExplicitAutograd")
    _torch_library = lib


def _has_torch_op(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.detectron2, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def ensure_detectron2_ops() -> bool:
    """Make ``detectron2._C`` importable; return True if the real one is present.

    Returns False when Detectron2 is missing entirely or when the fallback was
    installed. Safe to call any number of times.
    """
    existing = sys.modules.get("detectron2._C")
    if existing is not None:
        return not getattr(existing, FALLBACK_MARKER, False)
    try:
        importlib.import_module("detectron2")
    except ImportError:
        return False
    try:
        importlib.import_module("detectron2._C")
        return True
    except (ImportError, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    module = _FallbackExtension("detectron2._C", __doc__)
    setattr(module, FALLBACK_MARKER, True)
    sys.modules["detectron2._C"] = module
    setattr(sys.modules["detectron2"], "_C", module)
    _register_torch_ops()
    logger.info("detectron2._C could not be loaded (%s); using largedet's fallback.", reason)
    return False
