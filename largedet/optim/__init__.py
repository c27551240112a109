"""Large-batch optimizers: PMD-LAMB, LAMB and LARS, as ``torch.optim.Optimizer`` classes.

They depend on torch only; the Detectron2 wiring (``SOLVER.OPTIMIZER`` and the
optimizer registry) lives in :mod:`largedet.solver`.
"""

from .lars import LARS
from .pmd_lamb import LAMB, MOMENT_DECAYS, PMDLAMB, moment_decay

__all__ = ["PMDLAMB", "LAMB", "LARS", "MOMENT_DECAYS", "moment_decay"]
