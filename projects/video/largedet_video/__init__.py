"""largedet_video: TSM/TSN video classification on Detectron2, reusing largedet.

Importing it imports :mod:`largedet` first (which makes Detectron2 importable
where its compiled extension cannot load) and registers the video
meta-architecture (``VideoClassifier``) and backbones. Datasets are registered
from a config with :func:`largedet_video.data.register_video_datasets`.
"""

import largedet  # noqa: F401  (before detectron2)

from . import modeling  # noqa: F401  (registers VideoClassifier and the backbones)
from .config import add_video_config

__all__ = ["add_video_config"]
