"""The error of a config that cannot run, shared by the config's checks
(:mod:`.validate`) and its yaml loader (:mod:`.safe_yaml`)."""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config that cannot run. The message is one line, ``"<file or key>: <what>"``."""
