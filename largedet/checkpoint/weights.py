"""Weights files read without running code: Detectron2's model-zoo ``.pkl`` format through an
unpickler that admits only what such files hold, ``.pth`` (and pycls ``.pyth``) files with
torch's ``weights_only=True`` given explicitly, whatever the environment says; each refusal one line (:class:`UnsafeWeightsError`), and weights at a URL
that cannot be fetched :class:`WeightsUnavailableError`."""

from __future__ import annotations

import io
import pickle
import re
from typing import Any, Dict, Optional

import torch

__all__ = [
    "UnsafeWeightsError",
    "WeightsUnavailableError",
    "check_torch_weights",
    "first_sentence",
    "load_model_zoo_pickle",
    "load_torch_file",
]


def first_sentence(error: BaseException) -> str:
    """The first sentence of an error's message, on one line (torch's own advice after it
    would bury the file's name)."""
    text = " ".join(str(error).split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


class WeightsUnavailableError(OSError):
    """Weights named by a URL that could not be fetched."""


class UnsafeWeightsError(ValueError):
    """A ``.pkl`` weights file names a Python object that a model-zoo file never holds."""


# --- .pkl weights (Detectron2's model-zoo format) ---------------------------------------------

#: the globals a model-zoo .pkl may name: numpy's array, scalar and dtype reconstruction,
#: and the bytes of Python 3 protocol-2 pickles
_MODEL_ZOO_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
})  # fmt: skip


class _ModelZooUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings, numbers and numpy arrays; any other global
    (a function to call, a class to build) is refused before it is looked up."""

    def __init__(self, file, filename: str):
        super().__init__(file, encoding="latin1")
        self._filename = filename

    def find_class(self, module, name):
        if (module, name) in _MODEL_ZOO_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeWeightsError(
            f"refusing to load {self._filename}: it names the Python object {module}.{name}, "
            "which a model-zoo weights file never holds (only dicts, lists, tuples, strings, "
            "numbers and numpy arrays); loading it could run code"
        )


def load_model_zoo_pickle(filename: str, data: Optional[bytes] = None) -> Dict[str, Any]:
    """The weights of a ``.pkl`` file in Detectron2's model-zoo format, read without running
    code (:class:`UnsafeWeightsError` otherwise), as ``{"model": ..., "__author__": ...}``:
    a Detectron2 model-zoo file as it is; a Caffe2 / Detectron1 one (a dict of arrays, or
    of ``"blobs"``) without its ``*_momentum`` entries and with ``matching_heuristics``,
    as Detectron2's checkpointer reads them."""
    with (io.BytesIO(data) if data is not None else open(filename, "rb")) as f:
        loaded = _ModelZooUnpickler(f, filename).load()
    if not isinstance(loaded, dict):
        raise UnsafeWeightsError(f"{filename}: not a model-zoo weights file (a {type(loaded).__name__}, not a dict)")
    if "model" in loaded and "__author__" in loaded:
        return loaded
    arrays = loaded.get("blobs", loaded)  # detection models keep theirs under "blobs"
    model = {k: v for k, v in arrays.items() if not k.endswith("_momentum")}
    return {"model": model, "__author__": "Caffe2", "matching_heuristics": True}


def _refused(filename: str, error: pickle.UnpicklingError) -> UnsafeWeightsError:
    found = re.search(r"GLOBAL (\S+)", str(error))
    what = f"it names the Python object {found.group(1)}" if found else first_sentence(error)
    return UnsafeWeightsError(
        f"refusing to load {filename}: {what}, which a weights file never holds; loading it could run code"
    )


def load_torch_file(filename: str) -> Any:
    """What the ``.pth`` file ``filename`` holds, read by ``torch.load`` with
    ``weights_only=True`` given explicitly, onto the CPU: no environment variable
    (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``) turns the restricted unpickler off. A file that
    names any other Python object is :class:`UnsafeWeightsError`, one line naming it; other
    errors (a truncated file) pass through."""
    try:
        return torch.load(filename, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refused(filename, e) from None


def load_pycls_file(filename: str) -> Dict[str, Any]:
    """A pycls ``.pyth`` checkpoint as Detectron2's checkpointer reads it (its
    ``model_state`` without the BN counters), through :func:`load_torch_file`."""
    data = load_torch_file(filename)
    if not isinstance(data, dict) or "model_state" not in data:
        raise UnsafeWeightsError(f"{filename}: not a pycls checkpoint (no 'model_state')")
    model = {k: v for k, v in data["model_state"].items() if not k.endswith("num_batches_tracked")}
    return {"model": model, "__author__": "pycls", "matching_heuristics": True}


def check_torch_weights(filename: str) -> None:
    """A ``.pth`` weights file loads as torch loads it, ``weights_only`` (tensors memory-mapped,
    not read): :class:`UnsafeWeightsError` naming the Python object a crafted file holds, or
    what else keeps it from loading, in one line."""
    try:
        try:
            torch.load(filename, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # the legacy (non-zip) format cannot be mapped
                raise
            torch.load(filename, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refused(filename, e) from None
    except Exception as e:
        raise UnsafeWeightsError(f"{filename}: does not load ({type(e).__name__}: {first_sentence(e)})") from None
