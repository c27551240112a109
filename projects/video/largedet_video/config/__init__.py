"""The video project's config, the project's bottom floor: its keys (:func:`add_video_config`,
each declared once with its value rule in :data:`VIDEO_KEYS`). It imports no other room of
``largedet_video``; the checks before launch that need the data, the model or multigrid live in
:mod:`largedet_video.engine.checks` and the rooms it calls."""

from .defaults import VIDEO_KEYS, add_video_config

__all__ = ["VIDEO_KEYS", "add_video_config"]
