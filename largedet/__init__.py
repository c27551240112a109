"""largedet: large mini-batch training of detectors and video models on Detectron2.

Importing ``largedet`` makes Detectron2 usable on machines where its compiled
extension ``detectron2._C`` cannot load (see :mod:`largedet.utils.d2_compat`).
Where a full Detectron2 is built, nothing is changed.
"""

from .utils.d2_compat import ensure_detectron2_ops

__version__ = "0.1.0"

HAS_COMPILED_D2_OPS = ensure_detectron2_ops()

__all__ = ["HAS_COMPILED_D2_OPS", "__version__"]
