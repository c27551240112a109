"""Large-batch optimizers: PMD-LAMB, LAMB and LARS, as ``torch.optim.Optimizer`` classes,
and AGVM, per-part LR multipliers for any optimizer.

What the training loop reads of an optimizer (the clock, the per-group keys, the compiled
step) is a small protocol of named members (:mod:`.protocol`), which they implement and a
user's optimizer may. They depend on torch only; the Detectron2 wiring
(``SOLVER.OPTIMIZER`` and the optimizer registry) lives in :mod:`largedet.solver`.
"""

from ._base import COMPILED_STEP_MODES, compiled_min_numel
from .agvm import AGVM, PART_KEY, PRECONDITIONERS, gradient_variance, modulation
from .lars import LARS
from .pmd_lamb import LAMB, MOMENT_DECAYS, PMDLAMB, moment_decay
from .protocol import compiled_tensors, group_keys, uses_clock

__all__ = [
    "AGVM",
    "COMPILED_STEP_MODES",
    "LAMB",
    "LARS",
    "MOMENT_DECAYS",
    "PART_KEY",
    "PMDLAMB",
    "PRECONDITIONERS",
    "compiled_min_numel",
    "compiled_tensors",
    "gradient_variance",
    "group_keys",
    "moment_decay",
    "modulation",
    "uses_clock",
]
