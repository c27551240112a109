"""The files of a checkpoint folder: each written through a temporary file beside it, renamed
into place once flushed to disk, and the temporary files of a save that was killed midway
told apart (by name, with the writing process's id)."""

from __future__ import annotations

import os
import re
import secrets
from typing import Callable, Optional

__all__ = ["is_temporary", "process_alive", "write_atomically", "writer_pid"]


# ".<file>.<pid>-<8 hex digits>.tmp"; also mkstemp's ".<file>.<8 characters>.tmp", the
# names of the temporary files of earlier versions
_TEMPORARY = re.compile(r"^\.(.+\.pth|last_checkpoint)\.(\d+-[0-9a-f]{8}|[a-z0-9_]{8})\.tmp$")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of :func:`write_atomically`'s temporary files."""
    return _TEMPORARY.match(name) is not None


def writer_pid(name: str) -> Optional[int]:
    """The id of the process that writes the temporary file ``name`` (None for the names
    of earlier versions, which do not hold it)."""
    match = _TEMPORARY.match(name)
    if match is None or "-" not in match.group(2):
        return None
    return int(match.group(2).split("-")[0])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def write_atomically(path: str, write: Callable) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, flush it to disk, then
    rename it to ``path`` (``os.replace``: atomic on POSIX and Windows). On any error the
    temporary file is removed and ``path`` is untouched. The file is created with mode
    0o666 less the process's umask, as ``open()`` creates files."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(
        directory, f".{os.path.basename(path)}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
