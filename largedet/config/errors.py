"""The error of a config that cannot run, shared by the config's checks
(:mod:`.validate`) and its yaml loader (:mod:`.safe_yaml`); several of them, collected by
the checks before launch so that a run reports every mistake at once
(:class:`ErrorCollector`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Sequence

__all__ = ["ConfigError", "ConfigErrors", "ErrorCollector", "error_lines"]


class ConfigError(ValueError):
    """A config that cannot run. The message is one line, ``"<file or key>: <what>"``."""


class ConfigErrors(ConfigError):
    """Several config errors of one run: :attr:`messages`, one line each (the message is
    those lines)."""

    def __init__(self, messages: Sequence[str]):
        self.messages = tuple(messages)
        super().__init__("\n".join(self.messages))


def error_lines(error: Exception) -> List[str]:
    """The lines of ``error``'s message: one per config error, each to be printed as
    ``error: <line>``."""
    return str(error).splitlines() or [type(error).__name__]


class ErrorCollector:
    """The errors of the checks before launch, collected to be reported at once::

        errors = ErrorCollector()
        with errors.check():
            check_something(cfg)      # a ConfigError is recorded, the checks go on
        errors.raise_if_any()         # ConfigError (one) or ConfigErrors (several)
    """

    def __init__(self, catch: tuple = (ConfigError,)):
        self.catch = catch
        self.messages: List[str] = []

    def __bool__(self) -> bool:
        return bool(self.messages)

    def add(self, error: Exception | str) -> None:
        """Record ``error`` (an exception: each line of its message; or a line)."""
        self.messages += error_lines(error) if isinstance(error, Exception) else [error]

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run the block; an error of :attr:`catch` it raises is recorded, not raised."""
        try:
            yield
        except self.catch as e:
            self.add(e)

    def raise_if_any(self) -> None:
        """Raise what was recorded: a :class:`ConfigError` for one line, a
        :class:`ConfigErrors` for several (duplicates once, in order)."""
        lines = list(dict.fromkeys(self.messages))
        if len(lines) == 1:
            raise ConfigError(lines[0])
        if lines:
            raise ConfigErrors(lines)
