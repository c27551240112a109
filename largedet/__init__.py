"""largedet: large mini-batch training of detectors and video models on Detectron2.

Importing ``largedet`` changes nothing in Detectron2 (see
:mod:`largedet.utils.d2_compat`); ``HAS_COMPILED_D2_OPS`` says whether Detectron2's
compiled extension ``detectron2._C`` is present. The start-up warnings of dependencies that
a user cannot act on are filtered first (:mod:`largedet.utils.startup_warnings`).
"""

from .utils.startup_warnings import filter_dependency_warnings

filter_dependency_warnings()

from .utils.d2_compat import has_compiled_detectron2_ops  # noqa: E402  (after the filter)

__version__ = "0.1.0"

HAS_COMPILED_D2_OPS = has_compiled_detectron2_ops()

__all__ = ["HAS_COMPILED_D2_OPS", "__version__"]
