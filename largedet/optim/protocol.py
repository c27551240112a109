"""What an optimizer tells largedet's training loop and solver about itself.

Three optional members, read by name, so that the loop and the solver never recognise an
optimizer by its class: largedet's optimizers declare them (PMD-LAMB, LAMB and LARS,
through :class:`~largedet.optim._base.LayerwiseOptimizer`), a user's may, and any other
``torch.optim.Optimizer`` (SGD, AdamW) gets the defaults.

- ``uses_clock`` (class attribute, default False): the optimizer has ``set_clock(clock)``,
  which the training loop calls before each step under a batch ramp with the step's
  position in steps of the full batch, so that a period in steps (PMD-LAMB's ``T``) stays
  a fixed number of images.
- ``group_keys`` (class attribute, default ``()``): the per-group keys it reads besides
  ``lr`` and ``weight_decay`` (``adapt`` for the layer-wise trust ratio), logged with each
  param group at start.
- ``compiled_tensors(group)`` (method, default: none): how many tensors of the param group
  ``group`` its compiled (fused) step updates, or None where it has no compiled step;
  logged with the group.

A user's optimizer declares them as class attributes and a method::

    class MyLAMB(torch.optim.Optimizer):
        uses_clock = True
        group_keys = ("adapt",)

        def set_clock(self, clock): ...
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch.optim import Optimizer

__all__ = ["compiled_tensors", "group_keys", "uses_clock"]


def uses_clock(optimizer: Optimizer) -> bool:
    """Whether ``optimizer`` takes the training loop's clock (``set_clock``)."""
    return bool(getattr(optimizer, "uses_clock", False))


def group_keys(optimizer: Optimizer) -> Tuple[str, ...]:
    """The per-group keys ``optimizer`` reads besides ``lr`` and ``weight_decay``."""
    return tuple(getattr(optimizer, "group_keys", ()))


def compiled_tensors(optimizer: Optimizer, group: Dict[str, Any]) -> Optional[int]:
    """How many tensors of ``group`` the compiled step of ``optimizer`` updates; None where
    it has no compiled step."""
    count = getattr(optimizer, "compiled_tensors", None)
    return None if count is None else count(group)
