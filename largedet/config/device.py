"""What a run's config asks of the machine: the device it runs on and its autocast dtype."""

from __future__ import annotations

import functools
import platform
from typing import FrozenSet, Optional, Tuple

import torch
from detectron2.config import CfgNode

from .defaults import AMP_PRECISIONS

__all__ = [
    "AUTO_DEVICE",
    "DeviceUnavailableError",
    "amp_dtype",
    "cpu_flags",
    "device_for",
    "native_precision",
    "resolve_device",
]

#: CPU feature flags (as /proc/cpuinfo names them) that compute each dtype in hardware
NATIVE_CPU_FLAGS = {
    "x86": {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")},
    "arm": {"bfloat16": ("bf16",), "float16": ("fphp", "asimdhp")},
}


#: ``MODEL.DEVICE`` value that runs on the GPU where torch finds one and on the CPU
#: elsewhere, with a warning saying so (the built-in shapes and moving-shapes configs)
AUTO_DEVICE = "auto"


class DeviceUnavailableError(ValueError):
    """The device a config names is not on this machine. One line naming the key."""


def device_for(asked: str, key: str = "MODEL.DEVICE") -> Tuple[str, Optional[str]]:
    """The torch device a run asking for ``asked`` (the value of ``key``) runs on, and the
    line to log about the choice (None where ``asked`` is taken as it is).

    ``"auto"`` (:data:`AUTO_DEVICE`) is ``"cuda"`` where torch finds a CUDA device and
    ``"cpu"`` elsewhere; ``"cuda"`` or ``"cuda:N"`` must find that device: raises
    :class:`DeviceUnavailableError` where there is none (no GPU, a broken driver, a
    CPU-only torch), so that a config that names a GPU never trains on the CPU. Any other
    value (``"cpu"``, ``"mps"``) is returned as it is."""
    if asked == AUTO_DEVICE:
        if torch.cuda.is_available():
            found = torch.cuda.device_count()
            return "cuda", f"{key} auto: {found} CUDA device(s) found, running on cuda"
        return "cpu", f"{key} auto: no CUDA device found, running on the CPU"
    if not asked.startswith("cuda"):
        return asked, None
    try:
        index = torch.device(asked).index or 0
    except RuntimeError:
        raise DeviceUnavailableError(
            f"{key}: {asked!r} is not a torch device (cuda, cuda:N, cpu, auto)"
        ) from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        found = f"{count} CUDA device(s)" if count else "no CUDA device"
        raise DeviceUnavailableError(
            f"{key}: {asked!r} asks for a GPU, but torch {torch.__version__} ({build}) finds "
            f"{found} on this machine; set {key} cpu, or auto to use a GPU where there is one"
        )
    return asked, None


def resolve_device(cfg: CfgNode, key: str = "MODEL.DEVICE") -> Optional[str]:
    """Set ``cfg.MODEL.DEVICE`` to the device it resolves to (:func:`device_for`; ``key``
    names it in messages: ``train.device`` on the LazyConfig path) and return the line to
    log about the choice, or None. Raises :class:`DeviceUnavailableError`. The line is
    returned, not logged, because the config is resolved before the loggers exist: the
    caller logs it once they do (:func:`largedet.engine.setup_cfg`)."""
    cfg.MODEL.DEVICE, note = device_for(cfg.MODEL.DEVICE, key)
    return note


@functools.lru_cache(maxsize=None)
def cpu_flags() -> FrozenSet[str]:
    """This CPU's feature flags: the ``flags`` (x86) or ``Features`` (Arm) of
    /proc/cpuinfo; empty where there is no such file (then no dtype counts as native)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _cpu_family() -> str:
    return "arm" if platform.machine().lower() in ("aarch64", "arm64") else "x86"


def native_precision(device: str, precision: str, flags: Optional[FrozenSet[str]] = None) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:1") computes ``precision`` ("bfloat16",
    "float16") in hardware. On a CPU, from its feature flags (``flags``, default
    :func:`cpu_flags`; :data:`NATIVE_CPU_FLAGS`); on a GPU, bfloat16 from compute
    capability 8.0 on, float16 always."""
    if device.startswith("cuda"):
        if precision == "float16":
            return True
        return torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in NATIVE_CPU_FLAGS[_cpu_family()][precision])


def amp_dtype(cfg: CfgNode) -> Optional[torch.dtype]:
    """The autocast dtype of ``SOLVER.AMP`` (None: full precision): ``SOLVER.AMP.PRECISION``
    when enabled, unless ``SOLVER.AMP.NATIVE_ONLY`` and ``MODEL.DEVICE`` does not compute it
    in hardware (:func:`native_precision`). ``ValueError`` naming ``SOLVER.AMP.PRECISION``
    for a dtype it does not know."""
    if not cfg.SOLVER.AMP.ENABLED:
        return None
    precision = cfg.SOLVER.AMP.PRECISION
    if precision not in AMP_PRECISIONS:
        raise ValueError(f"SOLVER.AMP.PRECISION must be one of {sorted(AMP_PRECISIONS)}, got {precision!r}")
    if cfg.SOLVER.AMP.NATIVE_ONLY and not native_precision(cfg.MODEL.DEVICE, precision):
        return None
    return getattr(torch, precision)
