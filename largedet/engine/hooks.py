"""Training hooks: the divergence guard and per-step seeding."""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from typing import Deque, Dict

import numpy as np
from detectron2.engine import HookBase
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng

__all__ = ["DivergenceGuard", "ReseedEveryIter", "step_seed"]

logger = logging.getLogger(__name__)


def step_seed(seed: int, iteration: int, rank: int) -> int:
    """A seed in [0, 2**31) derived from (``seed``, ``iteration``, ``rank``) by NumPy's ``SeedSequence``."""
    return int(np.random.SeedSequence([seed, iteration, rank]).generate_state(1)[0] % 2**31)


class ReseedEveryIter(HookBase):
    """Seeds Python's, NumPy's and torch's generators before every step with
    :func:`step_seed` (``seed``, iteration, rank), so that the random numbers a step draws
    (augmentation in the main process, proposal sampling, dropout) depend on the
    iteration only, and a resumed run repeats those of an uninterrupted one."""

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"ReseedEveryIter needs a seed >= 0, got {seed}")
        self._seed = seed

    def before_step(self):
        seed_all_rng(step_seed(self._seed, self.trainer.iter, comm.get_rank()))


class DivergenceGuard(HookBase):
    """Stops (or rolls back) a run whose loss is not finite or spikes.

    After each step it reads the step's total loss, averaged over micro-batches and
    ranks (the same number on every rank, so all ranks decide alike), from
    ``trainer.last_losses``. The step diverged when that loss is not finite, or when
    ``spike_factor > 0``, at least ``window`` earlier steps were seen, and the loss exceeds
    ``spike_factor`` times the median of the last ``window`` losses.

    Without ``rollback`` the hook raises ``FloatingPointError`` naming the iteration, the
    loss dict and the last good checkpoint (the one ``trainer.checkpointer`` last
    tagged; this hook must run before the checkpointer so that a diverged step is never
    saved). With ``rollback`` it reloads the weights and optimizer state of that
    checkpoint (and the gradient scaler's, if any) and multiplies the LR scheduler's base
    LRs by ``lr_factor``; the LR reaches the optimizer through the scheduler, so this hook
    must run before the ``LRScheduler`` hook. The iteration count, schedule and data
    stream go on. It raises instead when there is no checkpoint yet or after
    ``max_rollbacks`` rollbacks.
    """

    def __init__(
        self,
        spike_factor: float = 10.0,
        window: int = 50,
        *,
        rollback: bool = False,
        lr_factor: float = 0.5,
        max_rollbacks: int = 3,
    ):
        if spike_factor != 0 and spike_factor <= 1:
            raise ValueError(f"spike_factor must be > 1 (or 0: off), got {spike_factor}")
        if window < 1 or max_rollbacks < 0 or not 0 < lr_factor <= 1:
            raise ValueError(
                f"need window >= 1, max_rollbacks >= 0 and 0 < lr_factor <= 1; "
                f"got {window}, {max_rollbacks}, {lr_factor}"
            )
        self.spike_factor = spike_factor
        self.window = window
        self.rollback = rollback
        self.lr_factor = lr_factor
        self.max_rollbacks = max_rollbacks
        self.history: Deque[float] = deque(maxlen=window)
        self.rollbacks = 0

    @classmethod
    def from_config(cls, cfg) -> "DivergenceGuard":
        d = cfg.SOLVER.DIVERGENCE
        return cls(
            d.SPIKE_FACTOR,
            d.WINDOW,
            rollback=d.ROLLBACK,
            lr_factor=d.ROLLBACK_LR_FACTOR,
            max_rollbacks=d.MAX_ROLLBACKS,
        )

    def check(self, loss: float) -> str:
        """Why ``loss`` is a divergence ("" when it is not)."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if self.spike_factor and len(self.history) == self.window:
            median = statistics.median(self.history)
            if loss > self.spike_factor * median:
                return (
                    f"loss {loss:.6g} > {self.spike_factor:g} x {median:.6g}, "
                    f"the median of the last {self.window} steps"
                )
        return ""

    def after_step(self):
        loss = self.trainer.last_total_loss
        reason = self.check(loss)
        if not reason:
            self.history.append(loss)
            return
        checkpointer = self.trainer.checkpointer
        last_good = checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else ""
        message = (
            f"Training diverged at iteration {self.trainer.iter}: {reason}; "
            f"loss_dict = {self.trainer.last_losses}. "
            f"Last good checkpoint: {last_good or 'none'}"
        )
        if not self.rollback:
            raise FloatingPointError(message)
        if not last_good:
            raise FloatingPointError(message + " (nothing to roll back to)")
        if self.rollbacks >= self.max_rollbacks:
            raise FloatingPointError(message + f" (after {self.rollbacks} rollback(s))")
        self._roll_back(last_good)
        logger.warning(
            "%s. Rolled back to it (weights and optimizer state) with the LR x %g (rollback %d of %d).",
            message,
            self.lr_factor,
            self.rollbacks,
            self.max_rollbacks,
        )

    def _roll_back(self, path: str) -> None:
        trainer = self.trainer
        extra = trainer.checkpointer.load(path, checkpointables=[])  # the model's weights
        inner_state: Dict = extra["trainer"][
            "_trainer"
        ]  # Detectron2's DefaultTrainer.state_dict layout
        trainer.optimizer.load_state_dict(inner_state["optimizer"])
        grad_scaler = getattr(trainer._trainer, "grad_scaler", None)
        if grad_scaler is not None and "grad_scaler" in inner_state:
            grad_scaler.load_state_dict(inner_state["grad_scaler"])
        scheduler = trainer.scheduler
        scheduler.base_lrs = [lr * self.lr_factor for lr in scheduler.base_lrs]
        self.rollbacks += 1

    def state_dict(self):
        return {"history": list(self.history), "rollbacks": self.rollbacks}

    def load_state_dict(self, state_dict):
        self.history = deque(state_dict["history"], maxlen=self.window)
        self.rollbacks = state_dict["rollbacks"]
