"""Carry an interrupted study cell to another machine.

A cell's run folder (``output/...``) is not committed, so a cell stopped on one machine
would start again from step 0 on the next. With ``--carry DIR`` the study runner copies an
interrupted cell's last checkpoint and its records into ``DIR/<cell>/`` (a folder the next machine reads, on
a shared disk: a checkpoint is 7-9 MB) and, on a machine whose run folder holds no checkpoint of that cell, copies them
back before it resumes the cell; a finished cell's entry is removed.

What travels: the file ``last_checkpoint`` names and ``last_checkpoint`` itself, and every
other plain file of the run folder except older checkpoints, locks and TensorBoard event
files (``metrics.json``, ``log.txt``, ``config.yaml``, ``run_summary.json``, the study's
wall-clock file and log). The trainer's ``--resume`` then continues from that checkpoint
exactly as on the machine that wrote it: ``metrics.json`` records past the checkpoint's
step are dropped on resume, so nothing logged after it survives twice.
"""

from __future__ import annotations

import os
import shutil
from typing import List, Optional

__all__ = ["carried_files", "discard", "restore", "resumes", "save"]

_SKIPPED_SUFFIXES = (".lock", ".tmp")


def _checkpoint_name(run_dir: str) -> Optional[str]:
    path = os.path.join(run_dir, "last_checkpoint")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        name = f.read().strip()
    return name if name and os.path.isfile(os.path.join(run_dir, name)) else None


def carried_files(run_dir: str) -> List[str]:
    """The names of the files of ``run_dir`` that :func:`save` copies: empty when the run
    folder holds no usable checkpoint (``last_checkpoint`` missing, or naming no file)."""
    checkpoint = _checkpoint_name(run_dir)
    if checkpoint is None:
        return []
    names = []
    for name in sorted(os.listdir(run_dir)):
        if not os.path.isfile(os.path.join(run_dir, name)):
            continue
        if name.endswith(".pth") and name != checkpoint:
            continue
        if name.endswith(_SKIPPED_SUFFIXES) or name.startswith("events.out.tfevents"):
            continue
        names.append(name)
    return names


def save(run_dir: str, dest: str) -> bool:
    """Replace ``dest`` with ``run_dir``'s last checkpoint and records; False (``dest``
    untouched) when ``run_dir`` holds no checkpoint. The copy is made beside ``dest`` and
    renamed into place, so an interrupted save leaves the previous carry whole."""
    names = carried_files(run_dir)
    if not names:
        return False
    staging = dest.rstrip(os.sep) + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for name in names:
        shutil.copy2(os.path.join(run_dir, name), os.path.join(staging, name))
    old = dest.rstrip(os.sep) + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(dest):
        os.replace(dest, old)
    os.replace(staging, dest)
    shutil.rmtree(old, ignore_errors=True)
    return True


def restore(src: str, run_dir: str) -> bool:
    """Copy a carried cell from ``src`` into ``run_dir`` when ``run_dir`` holds no checkpoint
    of its own and ``src`` holds one; True when it did. A run folder with its own checkpoint
    is never overwritten: it is at least as far as anything this machine carried out."""
    if _checkpoint_name(run_dir) is not None or _checkpoint_name(src) is None:
        return False
    os.makedirs(run_dir, exist_ok=True)
    for name in carried_files(src):
        shutil.copy2(os.path.join(src, name), os.path.join(run_dir, name))
    return True


def discard(dest: str) -> None:
    """Remove a finished cell's carry (its row and archive now hold what it produced)."""
    shutil.rmtree(dest, ignore_errors=True)


def resumes(run_dir: str, carried: Optional[str]) -> bool:
    """Whether a cell starts from a checkpoint: ``run_dir``'s own, or one carried in
    ``carried`` (None: no carry folder)."""
    return _checkpoint_name(run_dir) is not None or (
        carried is not None and _checkpoint_name(carried) is not None
    )
