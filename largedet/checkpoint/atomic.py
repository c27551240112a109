"""Checkpoints that are complete or absent, never half-written, and a resume that checks them."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from dataclasses import dataclass
from urllib.parse import urlparse
from typing import Any, Dict, List, Optional, Tuple

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.utils import comm

from .files import is_temporary, process_alive, write_atomically, writer_pid
from .weights import (  # re-exported: the names callers have used
    UnsafeWeightsError,
    WeightsUnavailableError,
    check_torch_weights,
    first_sentence,
    load_model_zoo_pickle,
    load_pycls_file,
    load_torch_file,
)

__all__ = [
    "AtomicCheckpointer",
    "CheckpointSpaceError",
    "DiskFullError",
    "FoundCheckpoint",
    "LaterCheckpointError",
    "NoCompleteCheckpointError",
    "UnsafeWeightsError",
    "WeightsUnavailableError",
    "check_output_dir",
    "check_torch_weights",
    "is_disk_full",
    "last_checkpoint_state",
    "load_model_zoo_pickle",
    "warn_if_low_space",
]

logger = logging.getLogger(__name__)

_TAG = "last_checkpoint"


class NoCompleteCheckpointError(RuntimeError):
    """``--resume`` found checkpoint files, or a ``last_checkpoint`` tag, but no checkpoint
    that loads completely."""


class LaterCheckpointError(RuntimeError):
    """A save would write over a checkpoint of a later iteration (one line naming the file)."""


class DiskFullError(OSError):
    """A file of the run (a checkpoint, a log) could not be written for lack of disk space;
    the message is one line naming the file. Training scripts print it as
    ``error: <message>`` and exit with status 74."""


class CheckpointSpaceError(DiskFullError):
    """A checkpoint could not be written for lack of disk space; the message is one line
    naming the file, the bytes it needs and the bytes free."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write that found no space (``ENOSPC``) or no quota (``EDQUOT``)."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def last_checkpoint_state(save_dir: str) -> str:
    """What a run that stops on a full disk leaves in ``save_dir``, for its one-line error:
    the tagged checkpoint, intact, or that no checkpoint was written yet."""
    try:
        with open(os.path.join(save_dir, _TAG)) as f:
            tagged = f.read().strip()
    except OSError:
        tagged = ""
    if tagged and os.path.isfile(os.path.join(save_dir, tagged)):
        return f"the previous checkpoint {tagged} and {_TAG} are unchanged"
    return "no checkpoint had been written (--resume starts from scratch)"


# --- disk space -------------------------------------------------------------------------------


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


def warn_if_low_space(directory: str, needed: int, what: str = "the next checkpoint") -> bool:
    """Warn (and return True) when ``directory`` has fewer than ``needed`` bytes free."""
    free = _free_bytes(directory)
    if free < needed:
        logger.warning(
            "%s has %d bytes free, less than %s needs (about %d bytes): free some space or "
            "the save will fail", directory, free, what, needed,
        )  # fmt: skip
        return True
    return False


def check_output_dir(path: str) -> None:
    """Create ``path`` if needed and write and remove a file in it; ``OSError`` with a
    one-line message naming it when that fails."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_test.{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"0")
        os.remove(probe)
    except OSError as e:
        raise OSError(f"OUTPUT_DIR {path!r} cannot be created or written: {e.strerror or e}") from None


def _state_bytes(data: Any) -> int:
    """The bytes of the tensors in a (nested) state."""
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    if isinstance(data, dict):
        return sum(_state_bytes(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return sum(_state_bytes(v) for v in data)
    return 0


class AtomicCheckpointer(DetectionCheckpointer):
    """Detectron2's ``DetectionCheckpointer`` whose files are written atomically and whose
    resume uses the newest checkpoint that loads completely.

    Saving: a checkpoint is written to a temporary file in the same folder and renamed
    into place once complete; the ``last_checkpoint`` tag is written the same way, and
    only after the checkpoint file is in place. A crash at any moment leaves the
    previous checkpoint and tag intact; the temporary files a killed save leaves behind
    are removed by the next save and by resume. Files are created with mode 0o666 less
    the process's umask, as ``open()`` creates them. A model state with a NaN or an
    infinity is never written or tagged: ``FloatingPointError`` names its tensors (the
    check costs one host sync per save).

    A save never writes over a checkpoint of a later iteration (the ``iteration`` recorded
    in it): :class:`LaterCheckpointError` names the file.

    Resuming (:meth:`resume_or_load` with ``resume=True``): every ``*.pth`` file of the
    folder is read (``torch.load`` with ``weights_only=True``, whole), and of those that
    load completely (the model and every checkpointable: for the trainer iteration,
    hooks, optimizer, gradient scaler, AGVM, data position) the one of the latest
    ``iteration`` recorded inside it is used; of two at the same iteration, the one
    ``last_checkpoint`` names. Modification times play no part (a copy, a ``touch``, a
    restore from backup changes nothing). The tag never holds a run back: a run killed
    between writing a checkpoint and tagging it resumes from that checkpoint, and the
    files that do not load and what is wrong with the tag (empty, dangling, behind) are
    logged as a warning. A file that loads but
    holds none of the checkpointables (e.g. pretrained weights kept in the folder) is
    not a checkpoint of the run and is passed over. When the folder holds checkpoints
    (files that do not load, or a tag) but none that loads completely,
    :class:`NoCompleteCheckpointError` lists them with the reasons: a resume never
    silently starts from scratch. Under ``torch.distributed`` every process searches
    the folder, and all must find the same file. :attr:`resumed_from` is the file the
    last :meth:`resume_or_load` resumed from ("" when none).

    Folders that are not local paths (``PathManager`` URLs) are written and resumed by
    ``DetectionCheckpointer`` as usual.
    """

    def __init__(self, model, save_dir: str = "", **kwargs: Any):
        super().__init__(model, save_dir, **kwargs)
        self.resumed_from = ""
        self._preloaded: Optional[Tuple[str, Dict[str, Any]]] = None
        self.last_size: Optional[int] = None  # bytes of the last checkpoint written

    def _is_local(self) -> bool:
        return "://" not in self.save_dir

    def load(self, path: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Detectron2's ``load``; weights named by a URL (``detectron2://``, ``https://``) that
        cannot be fetched (an offline node) are :class:`WeightsUnavailableError`, one line."""
        if path and "://" in path and not os.path.isfile(path):
            try:
                self.path_manager.get_local_path(urlparse(path)._replace(query="").geturl())
            except OSError as e:  # URLError included
                reason = getattr(e, "reason", None) or first_sentence(e)
                raise WeightsUnavailableError(
                    f"{path}: cannot be fetched ({type(e).__name__}: {reason}); on a machine "
                    "without internet, fetch the file where there is one and give its path"
                ) from None
        return super().load(path, *args, **kwargs)

    # --- saving --------------------------------------------------------------------------

    def save(self, name: str, **kwargs: Any) -> None:
        if not self._is_local():
            return super().save(name, **kwargs)
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        _check_finite(data["model"], f"{name}.pth")
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        basename = f"{name}.pth"
        save_file = os.path.join(self.save_dir, basename)
        _refuse_overwriting_later(save_file, data.get("iteration"))
        logger.info("Saving checkpoint to %s", save_file)
        os.makedirs(self.save_dir, exist_ok=True)
        self.remove_temporary_files()
        needed = self.last_size if self.last_size is not None else _state_bytes(data)
        warn_if_low_space(self.save_dir, needed, f"checkpoint {basename}")
        try:
            write_atomically(save_file, lambda f: torch.save(data, f))
        except (OSError, RuntimeError) as e:
            free = _free_bytes(self.save_dir)
            if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT) and free >= needed:
                raise
            error = CheckpointSpaceError(
                f"{save_file}: no space left on the device: the checkpoint needs about {needed} "
                f"bytes and {free} are free; {last_checkpoint_state(self.save_dir)}"
            )
            error.errno = errno.ENOSPC
            raise error from None
        self.last_size = os.path.getsize(save_file)
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        if not self._is_local():
            return super().tag_last_checkpoint(last_filename_basename)
        write_atomically(
            os.path.join(self.save_dir, _TAG),
            lambda f: f.write(last_filename_basename.encode()),
        )

    def remove_temporary_files(self) -> None:
        """Remove the temporary files of saves that were killed midway (main process only:
        the one that writes). A file whose name holds the id of another live process is
        that process's save in progress and is left alone."""
        if not (self._is_local() and self.save_to_disk and os.path.isdir(self.save_dir)):
            return
        for name in os.listdir(self.save_dir):
            if not is_temporary(name):
                continue
            pid = writer_pid(name)
            if pid is not None and pid != os.getpid() and process_alive(pid):
                logger.warning("Leaving %s: process %d, which is writing it, is alive", name, pid)
                continue
            logger.info("Removing %s, left by an interrupted save", name)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.save_dir, name))

    # --- resuming ------------------------------------------------------------------------

    def resume_or_load(self, path: str, *, resume: bool = True) -> Dict[str, Any]:
        """With ``resume``, load everything from the newest complete checkpoint of
        ``save_dir`` (see the class docstring), else, or when the folder has no
        checkpoint, only the model's weights from ``path``."""
        self.resumed_from = ""
        if not resume or not self._is_local():
            if resume and self.has_checkpoint():
                self.resumed_from = self.get_checkpoint_file()
            return super().resume_or_load(path, resume=resume)
        self.remove_temporary_files()
        found = self.newest_complete_checkpoint()
        if found is None:
            logger.info("No checkpoint in %s: starting from %r", self.save_dir, path)
            return self.load(path, checkpointables=[])
        logger.log(found.log_level, "Resuming from %s%s", found.path, found.notes())
        extra = self.load_found(found)
        self.resumed_from = found.path
        return extra

    def newest_complete_checkpoint(self, before: Optional[int] = None) -> Optional["FoundCheckpoint"]:
        """The checkpoint of ``save_dir`` of the latest iteration (below ``before``, where
        given) that loads completely, loaded, or None when the folder holds no checkpoint;
        raises :class:`NoCompleteCheckpointError` when it holds some but none is complete."""
        found, skipped, ignored, iterations = self._search(before)
        chosen = os.path.basename(found[0]) if found else ""
        # below an iteration, the tag (at the latest) is no concern
        tag = "" if before is not None else self._tag_problem(chosen, [n for n, _ in skipped], ignored, iterations)
        if comm.get_world_size() > 1:
            choices = comm.all_gather(chosen)
            if len(set(choices)) > 1:
                raise RuntimeError(
                    f"The processes found different checkpoints in {self.save_dir} "
                    f"(rank: file): {dict(enumerate(choices))}"
                )
        if found is not None:
            return FoundCheckpoint(found[0], found[1], skipped, tag)
        if (skipped or tag) and not iterations:
            reasons = [f"{name}: {why}" for name, why in skipped] + ([tag] if tag else [])
            if len(reasons) > 3:
                reasons = reasons[:3] + [f"and {len(reasons) - 3} more"]
            raise NoCompleteCheckpointError(
                f"--resume: no checkpoint in {self.save_dir} loads completely ({'; '.join(reasons)}); "
                f"restore a checkpoint, or remove these files (and {_TAG}) to start from scratch"
            )
        return None

    def load_found(
        self, found: "FoundCheckpoint", checkpointables: Optional[List[str]] = None
    ) -> Dict[str, Any]:
        """``load(found.path, checkpointables)`` from the contents the search already read
        (once: they are consumed)."""
        self._preloaded = (os.path.abspath(found.path), found.data)
        try:
            return self.load(found.path, checkpointables)
        finally:
            self._preloaded = None

    def _load_file(self, filename):
        if filename.endswith(".pkl"):  # Detectron2 reads these with pickle.load
            return load_model_zoo_pickle(filename)
        if filename.endswith(".pyth"):  # and these with torch.load's defaults
            return load_pycls_file(filename)
        return super()._load_file(filename)

    def _torch_load(self, f: str) -> Dict[str, Any]:
        """The file ``f`` (a local path) read with ``weights_only=True`` given explicitly
        (:func:`~largedet.checkpoint.weights.load_torch_file`; fvcore's ``torch.load`` leaves
        it to the environment), or what the resume search read already."""
        if self._preloaded is not None and os.path.abspath(f) == self._preloaded[0]:
            data, self._preloaded = self._preloaded[1], None
            return data
        return load_torch_file(f)

    def _search(self, before: Optional[int] = None) -> Tuple[
        Optional[Tuple[str, Dict[str, Any]]], List[Tuple[str, str]], List[str], Dict[str, int]
    ]:
        """(path, data) of the complete checkpoint of the latest iteration (of two at the same
        iteration, the tagged one, then the later name) or None, (file, why) for each file
        that failed, the files that are no training checkpoint, and the iteration of each
        complete one; with ``before``, only those of an earlier iteration are chosen. Two
        checkpoints at most are held at a time."""
        skipped: List[Tuple[str, str]] = []
        ignored: List[str] = []
        iterations: Dict[str, int] = {}
        keys = list(self.checkpointables)
        tagged = self._tagged()
        best: Optional[Tuple[Tuple[int, bool, str], str, Dict[str, Any]]] = None
        for name in self._candidates():
            path = os.path.join(self.save_dir, name)
            try:
                data = self._torch_load(path)
            except Exception as e:  # any reason a file does not load makes it unusable
                skipped.append((name, f"does not load ({type(e).__name__}: {first_sentence(e)})"))
                continue
            if not isinstance(data, dict):
                skipped.append((name, f"holds a {type(data).__name__}, not a checkpoint dict"))
                continue
            if keys and not any(k in data for k in keys):
                logger.info("Ignoring %s: it holds no training state (not a checkpoint)", path)
                ignored.append(name)
                continue
            missing = [k for k in ["model", *keys] if k not in data]
            if missing:
                skipped.append((name, f"incomplete: no {', '.join(map(repr, missing))}"))
                continue
            iterations[name] = _iteration(data)
            rank = (iterations[name], name == tagged, name)
            if (best is None or rank > best[0]) and (before is None or rank[0] < before):
                best = (rank, path, data)
        return (best[1], best[2]) if best else None, skipped, ignored, iterations

    def _candidates(self) -> List[str]:
        """The ``*.pth`` files of ``save_dir``, by name."""
        if not os.path.isdir(self.save_dir):
            return []
        return sorted(
            name for name in os.listdir(self.save_dir)
            if name.endswith(".pth") and not is_temporary(name)
            and os.path.isfile(os.path.join(self.save_dir, name))
        )  # fmt: skip

    def _tagged(self) -> Optional[str]:
        """The file ``last_checkpoint`` names ("" when empty), None without the tag."""
        try:
            with open(os.path.join(self.save_dir, _TAG)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None

    def _tag_problem(
        self, chosen: str, skipped: List[str], ignored: List[str], iterations: Dict[str, int]
    ) -> str:
        """What is wrong with ``last_checkpoint``, given the file ``chosen`` ("" when none),
        the files ``skipped`` (whose reasons are given already) and ``ignored``, and the
        ``iterations`` of the complete ones; "" when it names ``chosen``, or there is
        neither a tag nor a checkpoint."""
        tagged = self._tagged()
        if tagged is None:
            return f"{_TAG} is missing" if chosen else ""
        if not tagged:
            return f"{_TAG} is empty"
        if tagged == chosen or tagged in skipped:
            return ""
        if not os.path.isfile(os.path.join(self.save_dir, tagged)):
            return f"{_TAG} names {tagged}, which does not exist"
        if tagged in ignored:
            return f"{_TAG} names {tagged}, which holds no training state"
        return (
            f"{_TAG} names {tagged} (iteration {iterations.get(tagged)}), but {chosen} holds a "
            f"later one ({iterations.get(chosen)}; as when a run stops between writing a "
            "checkpoint and tagging it)"
        )


@dataclass(frozen=True)
class FoundCheckpoint:
    """A checkpoint file that loaded completely, its contents (``data``, consumed by
    :meth:`AtomicCheckpointer.load_found`), the newer files ``skipped`` on the way, as
    (file, why), and what was wrong with the ``last_checkpoint`` tag ("" when nothing)."""

    path: str
    data: Dict[str, Any]
    skipped: List[Tuple[str, str]]
    tag_problem: str

    @property
    def iteration(self) -> int:
        """The iteration the checkpoint records (-1 where none)."""
        return _iteration(self.data)

    @property
    def log_level(self) -> int:
        return logging.WARNING if self.skipped or self.tag_problem else logging.INFO

    def notes(self) -> str:
        """The files skipped and the tag's problem, one per line ("" when none)."""
        lines = [f"skipped {name}: {why}" for name, why in self.skipped]
        lines += [self.tag_problem] if self.tag_problem else []
        return "".join(f"\n  {line}" for line in lines)


def _check_finite(state: Dict[str, Any], filename: str) -> None:
    """Raise ``FloatingPointError`` naming the tensors of a model state that hold a NaN or
    an infinity; one host sync for all of them."""
    tensors = {
        k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
    }
    if not tensors:
        return
    flags = [torch.isfinite(v).all() for v in tensors.values()]
    finite = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
    if all(finite):
        return
    bad = [k for k, ok in zip(tensors, finite) if not ok]
    raise FloatingPointError(
        f"Not saving checkpoint {filename}: the model has non-finite values in {', '.join(bad)}"
    )


def _iteration(data: Dict[str, Any]) -> int:
    """The ``iteration`` a checkpoint records (-1 where it records none)."""
    iteration = data.get("iteration", -1)
    return int(iteration) if isinstance(iteration, int) else -1


def _refuse_overwriting_later(path: str, iteration: Optional[int]) -> None:
    """Raise :class:`LaterCheckpointError` where ``path`` is a checkpoint recording a later
    iteration than ``iteration`` (read memory-mapped: its tensors are not read); a file
    that does not load is left to be replaced."""
    if not isinstance(iteration, int) or not os.path.isfile(path):
        return
    try:
        held = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a checkpoint that loads: nothing later is lost
        return
    later = _iteration(held) if isinstance(held, dict) else -1
    if later > iteration:
        raise LaterCheckpointError(
            f"{path}: holds iteration {later}, later than this run's {iteration}: not writing "
            "over it; --resume continues from the latest checkpoint, or give another OUTPUT_DIR"
        )
