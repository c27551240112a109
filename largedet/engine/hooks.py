"""Training hooks: the divergence guard and per-step seeding, the pruning checkpointer, the
skipped-images counter, and the registry of a user's hooks named by ``HOOKS``
(:data:`HOOK_REGISTRY`)."""

from __future__ import annotations

import logging
import math
import os
import re
import statistics
from collections import deque
from typing import TYPE_CHECKING, Deque, List, Optional

import numpy as np
from detectron2.engine import HookBase
from detectron2.engine.hooks import PeriodicCheckpointer
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from fvcore.common.registry import Registry

from ..checkpoint import FoundCheckpoint, NoCompleteCheckpointError
from ..config.errors import ConfigError
from ..solver.lr_scheduler import rescale_schedule

if TYPE_CHECKING:
    from ..data.build import DetectionTrainLoader

__all__ = [
    "HOOK_REGISTRY",
    "DivergenceGuard",
    "PruningPeriodicCheckpointer",
    "ReseedEveryIter",
    "SkippedImagesHook",
    "StepRolledBack",
    "build_config_hooks",
    "check_hook_names",
    "step_seed",
]

logger = logging.getLogger(__name__)

HOOK_REGISTRY = Registry("HOOK")
HOOK_REGISTRY.__doc__ = """
Registry of a user's training hooks, keyed by the names ``HOOKS`` lists. An entry is called
as ``builder(cfg)`` (a ``HookBase`` subclass taking the config, or a function) and returns a
Detectron2 ``HookBase``; the trainer adds it after its own hooks, before the run summary.
"""


def check_hook_names(cfg) -> None:
    """Every name of ``HOOKS`` is registered in :data:`HOOK_REGISTRY` (the check before
    launch); raises :class:`~largedet.config.errors.ConfigError` naming the key and the
    registered names."""
    names = sorted(n for n, _ in HOOK_REGISTRY)
    for name in cfg.HOOKS:
        if name not in names:
            raise ConfigError(
                f"HOOKS: {name!r} is not registered in HOOK_REGISTRY; registered: "
                f"{', '.join(names) or 'none (register one in a module given to --import)'}"
            )


def build_config_hooks(cfg) -> List[HookBase]:
    """The hooks ``HOOKS`` names, in order, each built as ``HOOK_REGISTRY.get(name)(cfg)``."""
    return [HOOK_REGISTRY.get(name)(cfg) for name in cfg.HOOKS]


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


class StepRolledBack(Exception):
    """Raised by a hook's ``after_step`` after it rolled the run back to a checkpoint
    (:meth:`largedet.engine.Trainer.roll_back`): the step just trained was undone, so the
    later hooks do not act on it (the trainer names them in a line) and training goes on
    after the restored iteration."""


#: Steps seen before the spike test starts, where ``window`` is longer
MIN_SPIKE_HISTORY = 5


class DivergenceGuard(HookBase):
    """Stops (or rolls back) a run whose loss or gradient is not finite, or whose loss spikes.

    After each step it reads, from the trainer's loop (``trainer.loop``, an
    :class:`~largedet.engine.train_loop.AccumulationTrainer`), the step's total loss averaged over
    micro-batches and ranks (``last_total_loss``) and the norm of its gradient
    (``last_grad_norm``): the same numbers on every rank, so all ranks decide alike. The
    step diverged when the loss is not finite; when the gradient is not finite while the
    loss is (the trainer then skipped the optimizer step, so the weights stay finite),
    unless a gradient scaler is in use (fp16: the scaler skips such steps by design);
    or when ``spike_factor > 0``, at least ``min(window, MIN_SPIKE_HISTORY)`` earlier steps
    were seen, and the loss exceeds ``spike_factor`` times the median of the last ``window``
    losses (of those seen, until there are ``window``): the first steps are watched too. This
    hook must run before the checkpointer, so that a diverged step is never saved.

    Without ``rollback`` the hook raises ``FloatingPointError`` naming the iteration, the
    reason, the loss dict and the last good checkpoint (the one ``last_checkpoint``
    names). With ``rollback`` it restores the newest checkpoint that loads completely
    (``AtomicCheckpointer.newest_complete_checkpoint``) with the trainer's
    ``roll_back``: the weights and everything else the checkpoint holds (iteration, LR
    scheduler, optimizer, gradient scaler, AGVM's ``mu``, this hook's loss history) but
    the data position, so that the steps after the checkpoint are run again on the data
    that follows, not on the batches that diverged. It multiplies the LR (the
    scheduler's base LRs and the optimizer's current LRs) by ``lr_factor``, relative to
    the LR before the rollback, so successive rollbacks compound. It raises instead when
    there is no checkpoint yet, when no checkpoint loads completely, or after
    ``max_rollbacks`` rollbacks (counted across resumes: the count is not rolled back). A run
    that diverges again before it has saved a checkpoint past the one it went back to goes
    back further, to the latest checkpoint before that one (whose weights led to divergence
    again), and raises when there is none.
    After a rollback it raises :class:`StepRolledBack`: the hooks after this one get no
    ``after_step`` for the undone step (no save, no LR step, no evaluation, no write).
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
        self._rolled_back_to: Optional[int] = None  # the iteration the last rollback restored

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

    def check(self, loss: float, grad_norm: float = 0.0) -> str:
        """Why a step with total loss ``loss`` and gradient norm ``grad_norm`` diverged
        ("" when it did not)."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if not math.isfinite(grad_norm):
            return f"non-finite gradient (norm {grad_norm}) with a finite loss; step skipped"
        if self.spike_factor and len(self.history) >= min(self.window, MIN_SPIKE_HISTORY):
            median = statistics.median(self.history)
            if loss > self.spike_factor * median:
                return (
                    f"loss {loss:.6g} > {self.spike_factor:g} x {median:.6g}, "
                    f"the median of the last {len(self.history)} steps"
                )
        return ""

    def after_step(self):
        trainer, loop = self.trainer, self.trainer.loop
        loss = loop.last_total_loss
        # with a gradient scaler, steps with non-finite gradients are part of fp16 training
        grad_norm = loop.last_grad_norm if loop.grad_scaler is None else 0.0
        reason = self.check(loss, grad_norm)
        if not reason:
            self.history.append(loss)
            return
        checkpointer = trainer.checkpointer
        last_good = checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else ""
        message = (
            f"Training diverged at iteration {trainer.iter}: {reason}; "
            f"loss_dict = {loop.last_losses}. "
            f"Last good checkpoint: {last_good or 'none'}"
        )
        if not self.rollback:
            raise FloatingPointError(message)
        if self.rollbacks >= self.max_rollbacks:
            raise FloatingPointError(message + f" (after {self.rollbacks} rollback(s))")
        try:
            found = checkpointer.newest_complete_checkpoint()
            again = found is not None and self._rolled_back_to is not None and found.iteration <= self._rolled_back_to
            if again:  # diverged before a checkpoint past the one restored: go back further
                last, found = found, checkpointer.newest_complete_checkpoint(before=found.iteration)
        except NoCompleteCheckpointError as e:
            raise FloatingPointError(f"{message} (nothing to roll back to: {e})") from e
        if again and found is None:
            raise FloatingPointError(
                f"{message} (the weights of {last.path}, restored by the last rollback, diverged "
                "again, and there is no earlier checkpoint to roll back to)"
            )
        if found is None:
            raise FloatingPointError(message + " (nothing to roll back to)")
        self._roll_back(found)
        self._rolled_back_to = found.iteration
        raise StepRolledBack(
            f"{message}. Rolled back to {found.path} (iteration {trainer.iter}; weights, optimizer, "
            f"LR scheduler, AGVM and the other training state; the data stream goes on) with the "
            f"LR x {self.lr_factor:g} (rollback {self.rollbacks} of {self.max_rollbacks}){found.notes()}"
        )

    def _roll_back(self, found: FoundCheckpoint) -> None:
        trainer = self.trainer
        rollbacks = self.rollbacks + 1
        lowered = [lr * self.lr_factor for lr in trainer.scheduler.base_lrs]
        trainer.roll_back(found)  # restores this hook's state and the scheduler's too
        self.rollbacks = rollbacks
        # the LR the next step uses: the lowered schedule's value at the restored iteration
        rescale_schedule(trainer.scheduler, lowered)

    def state_dict(self):
        return {"history": list(self.history), "rollbacks": self.rollbacks}

    def load_state_dict(self, state_dict):
        self.history = deque(state_dict["history"], maxlen=self.window)
        self.rollbacks = state_dict["rollbacks"]


_PERIODIC_CHECKPOINT = re.compile(r"model_(\d{7})\.pth")


class PruningPeriodicCheckpointer(PeriodicCheckpointer):
    """Detectron2's :class:`~detectron2.engine.hooks.PeriodicCheckpointer` with its
    ``max_to_keep`` read over the folder: after each periodic save, the oldest
    ``model_NNNNNNN.pth`` of the checkpointer's folder beyond ``max_to_keep`` are deleted,
    those of earlier (pre-empted, resumed) invocations included; ``model_final.pth`` and the
    checkpoint the ``last_checkpoint`` tag names are never deleted. ``max_to_keep`` None or
    0 keeps all."""

    def __init__(self, checkpointer, period: int, max_to_keep=None):
        super().__init__(checkpointer, period)  # Detectron2's own pruning off: ours is below
        self.keep = max_to_keep or None

    def step(self, iteration: int, **kwargs) -> None:
        super().step(iteration, **kwargs)
        saved = (iteration + 1) % self.period == 0 or iteration >= (self.max_iter or 0) - 1
        if self.keep is not None and saved:
            self.prune()

    def prune(self) -> list:
        """Delete the periodic checkpoints beyond the newest ``max_to_keep``; returns them."""
        folder = self.checkpointer.save_dir
        found = sorted(n for n in os.listdir(folder) if _PERIODIC_CHECKPOINT.fullmatch(n))
        tagged = os.path.basename(self.checkpointer.get_checkpoint_file() or "")
        deleted = [n for n in found[: -self.keep] if n != tagged]
        for name in deleted:
            os.remove(os.path.join(folder, name))
        if deleted:
            logger.info("Checkpoints kept: the newest %d; deleted %s", self.keep, ", ".join(deleted))
        return deleted


class SkippedImagesHook(HookBase):
    """Records ``data/skipped_images`` (:class:`~largedet.data.build.DetectionTrainLoader`
    counts them), the unreadable training images replaced so far
    on all ranks together (since the processes started), in the event storage (and so in
    metrics.json and TensorBoard) at the steps the writers write: every ``period``
    steps and the last."""

    def __init__(self, loader: "DetectionTrainLoader", period: int):
        self._loader = loader
        self._period = period

    def after_step(self):
        it = self.trainer.iter
        if (it + 1) % self._period and it != self.trainer.max_iter - 1:
            return
        total = sum(comm.all_gather(self._loader.num_skipped))
        self.trainer.storage.put_scalar("data/skipped_images", total, smoothing_hint=False)
