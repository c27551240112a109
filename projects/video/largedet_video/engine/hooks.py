"""Training hooks of the video project."""

from __future__ import annotations

from detectron2.engine import HookBase

__all__ = ["SkippedVideosHook"]


class SkippedVideosHook(HookBase):
    """Records ``data/skipped_videos``, the number of unreadable training videos
    this rank's loader has replaced so far, in the event storage (and so in
    metrics.json and TensorBoard)."""

    def __init__(self, loader):
        self._loader = loader

    def after_step(self):
        self.trainer.storage.put_scalar(
            "data/skipped_videos", self._loader.num_skipped, smoothing_hint=False
        )
