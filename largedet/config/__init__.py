"""largedet's config: the keys it adds to Detectron2's and their defaults
(:mod:`.defaults`), what a config asks of the machine (:mod:`.device`), the checks a run's
config passes before any worker starts (:mod:`.validate`), the LazyConfig mapping
(:mod:`.lazy`) and the user's modules of ``--import`` and ``IMPORTS`` (:mod:`.imports`). Only :mod:`.defaults` and :mod:`.device` are imported here.

The bottom floor: this package imports no other room of largedet. The checks that need the
data, the solver or the checkpoints live beside what they check (:mod:`largedet.data.checks`,
:func:`largedet.solver.check_optimizer_name`, :mod:`largedet.checkpoint.checks`), and the
entry points call them (:func:`largedet.engine.defaults.check_config`)."""

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
