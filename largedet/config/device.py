"""What a run's config asks of the machine: the device it runs on and its autocast dtype."""

from __future__ import annotations

import functools
import logging
import platform
from typing import FrozenSet, Optional

import torch
from detectron2.config import CfgNode

from .defaults import AMP_PRECISIONS

__all__ = ["amp_dtype", "cpu_flags", "native_precision", "resolve_device"]

logger = logging.getLogger(__name__)

#: CPU feature flags (as /proc/cpuinfo names them) that compute each dtype in hardware
NATIVE_CPU_FLAGS = {
    "x86": {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")},
    "arm": {"bfloat16": ("bf16",), "float16": ("fphp", "asimdhp")},
}


def resolve_device(cfg: CfgNode) -> None:
    """Run on the CPU when the config asks for CUDA on a machine without a GPU."""
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.info("No GPU found: MODEL.DEVICE %s -> cpu", cfg.MODEL.DEVICE)
        cfg.MODEL.DEVICE = "cpu"


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
