"""largedet's config: the keys it adds to Detectron2's and their defaults
(:mod:`.defaults`), what a config asks of the machine (:mod:`.device`), the checks a run's
config passes before any worker starts (:mod:`.validate`) and the LazyConfig mapping
(:mod:`.lazy`). Only :mod:`.defaults` and :mod:`.device` are imported here."""

from .defaults import AMP_PRECISIONS, BUFFER_MODES, EMA_EVAL_MODES, add_largedet_config
from .device import AUTO_DEVICE, DeviceUnavailableError, amp_dtype, device_for, resolve_device

__all__ = [
    "AMP_PRECISIONS",
    "BUFFER_MODES",
    "EMA_EVAL_MODES",
    "AUTO_DEVICE",
    "DeviceUnavailableError",
    "add_largedet_config",
    "amp_dtype",
    "device_for",
    "resolve_device",
]
