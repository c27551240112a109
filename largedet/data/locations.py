"""Where datasets and caches live, and how a generated folder is written there once.

Roots, each read from the environment on every call:

- :func:`datasets_root`: ``$LARGEDET_DATASETS``, default ``~/.cache/largedet/datasets``;
  official datasets under their own folders (``openimages/``), generated ones (shapes,
  moving shapes, the OpenImages fixture) under folders named by their parameters.
- :func:`cache_root`: ``$LARGEDET_CACHE``, default ``~/.cache/largedet``; parsed-file
  caches (``openimages/``).

A variable that is unset or empty gives the default: ``LARGEDET_DATASETS= python ...``
means "no override", never "the current folder". ``~`` is expanded.

:func:`build_once` is the one protocol for writing a generated folder (a dataset, a
cache entry): built in a temporary folder beside the target and renamed into place when
complete, under a lock, so that the target is either absent or complete and, of several
processes asking for it at once (the ranks of a machine, two study jobs), one builds and
the others wait and then read its result.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
from typing import Callable, Iterator, Optional

__all__ = ["build_once", "cache_root", "datasets_root"]

logger = logging.getLogger(__name__)


def _folder_from_env(variable: str, default: str) -> str:
    return os.path.expanduser(os.environ.get(variable) or default)


def datasets_root() -> str:
    """``$LARGEDET_DATASETS``, or ``~/.cache/largedet/datasets`` when it is unset or empty."""
    return _folder_from_env("LARGEDET_DATASETS", os.path.join("~", ".cache", "largedet", "datasets"))


def cache_root() -> str:
    """``$LARGEDET_CACHE``, or ``~/.cache/largedet`` when it is unset or empty."""
    return _folder_from_env("LARGEDET_CACHE", os.path.join("~", ".cache", "largedet"))


def _is_non_empty_dir(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    with os.scandir(path) as entries:
        return next(entries, None) is not None


def _is_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not _is_non_empty_dir(path)


@contextlib.contextmanager
def _exclusive_lock(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file at ``path`` (created if missing).

    The holder deletes the file before releasing it, so no lock file outlives a build. A
    waiter that then gets the lock on the deleted file finds that ``path`` is no longer
    its file and starts again on the current one, so at any time only the holder of the
    file at ``path`` is inside.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                held = False
        except BaseException:
            os.close(fd)
            raise
        if held:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)


def _temporary_pattern(name: str) -> "re.Pattern[str]":
    return re.compile(re.escape(f".tmp-{name}.") + "[0-9a-f]{8}")


def _make_temporary(parent: str, name: str) -> str:
    while True:
        folder = os.path.join(parent, f".tmp-{name}.{secrets.token_hex(4)}")
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue


def build_once(
    target: str,
    build: Callable[[str], None],
    *,
    is_complete: Optional[Callable[[str], bool]] = None,
) -> str:
    """Make ``target`` a folder filled by ``build``, built at most once; returns ``target``.

    If ``is_complete(target)`` holds, nothing is done. Otherwise, holding an exclusive
    lock on ``<parent>/.<name>.lock`` (``fcntl.flock``; other processes and threads asking
    for the same target wait on it), and if the target is still not complete:
    ``build(folder)`` fills a new empty folder ``<parent>/.tmp-<name>.<8 hex digits>``,
    which is then renamed to ``target`` (atomic on one file system). So ``target`` is
    absent or complete at every moment, whoever reads it:

    - an exception in ``build`` (``KeyboardInterrupt`` included) removes the temporary
      folder and propagates; nothing is left at ``target``;
    - a temporary folder left by a killed process is removed by the next build of the
      same target (only one builder runs at a time, so it is nobody's);
    - the lock file is removed when the lock is released.

    Args:
        target: the folder to make; its parent is created if missing.
        build: writes the folder's contents into the folder it is given.
        is_complete: whether a folder at ``target`` is complete (default: it is a
            non-empty folder). A target that exists and is not complete is replaced
            only when it is an empty folder; anything else there is a
            ``FileExistsError`` naming it (it is never deleted).
    """
    complete = is_complete or _is_non_empty_dir
    if complete(target):
        return target
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    with _exclusive_lock(os.path.join(parent, f".{name}.lock")):
        if complete(target):
            return target
        pattern = _temporary_pattern(name)
        for entry in os.listdir(parent):
            if pattern.fullmatch(entry):
                logger.warning("Removing %s, left by an interrupted build", entry)
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        if os.path.lexists(target) and not _is_empty_dir(target):
            raise FileExistsError(
                errno.EEXIST,
                "exists but is not a complete build (left by an older version or written "
                "with other parameters?); remove it or choose another folder",
                target,
            )
        folder = _make_temporary(parent, name)
        try:
            build(folder)
            try:
                os.rename(folder, target)
            except OSError:
                # A writer that does not take the lock may have finished first.
                if not complete(target):
                    raise
        finally:
            if os.path.lexists(folder):
                shutil.rmtree(folder, ignore_errors=True)
    return target
