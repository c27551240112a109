"""The video project's config: its keys (:func:`add_video_config`, each declared once with
its value rule in :data:`VIDEO_KEYS`) and the checks before launch (:mod:`.validate`)."""

from .defaults import VIDEO_KEYS, add_video_config

__all__ = ["VIDEO_KEYS", "add_video_config"]
