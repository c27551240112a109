"""Whether Detectron2's compiled extension ``detectron2._C`` is present.

Detectron2 reaches its C++/CUDA ops two ways: the module ``detectron2._C``
(deformable convolution on GPUs, the fast COCO evaluator ``COCOeval_opt``,
build information) and the torch op namespace ``torch.ops.detectron2`` (rotated
boxes). Faster and Mask R-CNN need none of them, and Detectron2 itself copes
when the extension is missing (a wheel built for another Python or torch):
``COCOEvaluator`` falls back to pycocotools, ``DeformConv`` becomes a
placeholder whose construction raises an ``ImportError`` naming
``detectron2._C``, the rotated-box ops fail when called.

largedet therefore installs nothing into Detectron2: importing it leaves every
Detectron2 module, ``sys.modules`` entry and torch op as it was, so Detectron2
code behaves the same with or without ``import largedet``. This module only
answers whether the compiled ops are there.
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger(__name__)


def has_compiled_detectron2_ops() -> bool:
    """True if Detectron2 and its compiled extension ``detectron2._C`` both import.

    Detectron2 imports the extension itself when ``detectron2.layers`` loads, so
    trying it here changes nothing: where it loads it is the real one, where it
    fails nothing is left behind (a failed import is not kept in ``sys.modules``).
    """
    try:
        importlib.import_module("detectron2")
    except ImportError:
        return False
    try:
        importlib.import_module("detectron2._C")
    except (ImportError, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        logger.debug("detectron2._C is not available (%s).", reason)
        return False
    return True
