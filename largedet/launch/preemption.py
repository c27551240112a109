"""Pre-emption: on a signal, finish the optimizer step, save a checkpoint, exit with status 75.

A cluster that takes a job away (Slurm's pre-emption or time-out, torchrun's SIGTERM, a
spot instance going away) signals the training processes. :class:`PreemptionHook` catches
the signals ``PREEMPTION.SIGNALS`` names; the handler only records the signal. The ranks
agree on the step at which they stop without a host sync of their own: each rank's flag
travels in the all-gather of the step's losses that the trainer makes anyway
(:class:`~largedet.engine.train_loop.AccumulationTrainer`), so every rank learns in the
same step that some rank was signalled, a rank that got no signal included. After that
step (its LR step and periodic checkpoint done) the main process writes an atomic
checkpoint with the data position, every rank waits for it, the log says
``pre-empted at iteration N: checkpoint <file>``, and every process exits with
:data:`PREEMPTED_EXIT_CODE` (``Preempted``, a ``SystemExit``). ``--resume`` then continues
at step N + 1: no step is trained twice. Where the signal is Slurm's cancel (``scancel``
without ``--signal``: :func:`~largedet.launch.slurm_state.slurm_job_cancelled`), the same
happens, but the log says ``cancelled``, the run summary ``cancelled``, and the processes
exit :data:`CANCELLED_EXIT_CODE`: the job is not requeued.

A signal during the final evaluation (the hooks' ``after_train``, after the last step and
its ``model_final`` checkpoint) abandons the evaluation at once: ``Preempted`` is raised
from the handler, and ``--resume`` evaluates the final checkpoint without training a
step. The handlers stay installed until :meth:`PreemptionHook.restore_signals` (the
trainer calls it once every hook's ``after_train`` ran).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Dict, NoReturn, Optional, Sequence

from detectron2.engine import HookBase
from detectron2.utils import comm

from .slurm_state import slurm_job_cancelled

__all__ = [
    "CANCELLED_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "Diverged",
    "Preempted",
    "PreemptionHook",
    "exit_raised_from_handler",
    "forget_exit_raised_from_handler",
    "parse_signals",
    "raise_from_handler",
]

logger = logging.getLogger(__name__)

#: Exit status of a pre-empted run: sysexits' EX_TEMPFAIL ("try again later")
PREEMPTED_EXIT_CODE = 75
#: Exit status of a run whose Slurm job was cancelled (``scancel`` without ``--signal``): its
#: checkpoint written, not requeued; 128 + SIGTERM, as a shell reports a process SIGTERM ended
CANCELLED_EXIT_CODE = 143


class Diverged(FloatingPointError):
    """A run stopped on a divergence; the training loop has logged its one line (what
    diverged, at which iteration, the last good checkpoint). The scripts exit
    :data:`~largedet.launch.processes.DIVERGED_EXIT_CODE` on it without a traceback."""


class Preempted(SystemExit):
    """Raised on every rank after the pre-emption checkpoint is written; exits with
    :data:`PREEMPTED_EXIT_CODE`, or where the run's Slurm job is being cancelled
    (``scancel`` without ``--signal``: ``cancelled``) with
    :data:`CANCELLED_EXIT_CODE`, which the job does not requeue.
    :attr:`status` is how the run summary names it."""

    def __init__(self, iteration: int, checkpoint: str, cancelled: bool = False):
        super().__init__(CANCELLED_EXIT_CODE if cancelled else PREEMPTED_EXIT_CODE)
        self.iteration, self.checkpoint, self.cancelled = iteration, checkpoint, cancelled

    @property
    def status(self) -> str:
        return "cancelled" if self.cancelled else "preempted"


#: the exit a signal handler of this process raised into the code it interrupted (None: none)
_raised_from_handler: Optional[SystemExit] = None


def raise_from_handler(exit: SystemExit) -> NoReturn:
    """Raise ``exit`` from a signal handler, and remember it: the code it interrupts may
    turn it into an error of its own (a clean-up that fails on half-done state), and the
    process still ends with ``exit``'s status
    (:func:`~largedet.launch.processes.signalled_exit_wins`,
    :func:`~largedet.launch.run_summary.run_after_train_hooks`)."""
    global _raised_from_handler
    _raised_from_handler = exit
    raise exit


def exit_raised_from_handler() -> Optional[SystemExit]:
    """The exit :func:`raise_from_handler` raised in this process, or None."""
    return _raised_from_handler


def forget_exit_raised_from_handler() -> None:
    """Forget the last :func:`raise_from_handler` (a job's start: an earlier run of the
    process, as in a test session, is not this one)."""
    global _raised_from_handler
    _raised_from_handler = None


def parse_signals(names: Sequence[str]) -> list:
    """``signal.Signals`` of names such as ``"SIGTERM"``; ValueError naming an unknown one."""
    out = []
    for name in names:
        sig = getattr(signal.Signals, str(name), None)
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(
                f"PREEMPTION.SIGNALS: {name!r} is not a signal that can be caught "
                "(e.g. 'SIGTERM', 'SIGUSR1', 'SIGUSR2')"
            )
        out.append(sig)
    return out


class PreemptionHook(HookBase):
    """See the module docstring. ``signals``: what to catch (``PREEMPTION.SIGNALS``); the
    previous handlers come back after training. Handlers can only be installed in the main
    thread; elsewhere (a trainer run in a thread) the hook warns and does nothing."""

    def __init__(self, signals: Sequence[str]):
        self._signals = parse_signals(signals)
        self._previous: Dict[signal.Signals, object] = {}
        self._training_done = False  # after the last step: a signal stops at once
        #: the Preempted that a signal during the final evaluation raised (None: none)
        self.raised: Optional[Preempted] = None

    def _handle(self, signum, frame) -> None:
        self.trainer.loop.request_stop(signum)
        if self._training_done:
            self._stop_after_training([signum])

    def _stop_after_training(self, signums) -> None:
        path = self.trainer.checkpointer.get_checkpoint_file()  # model_final's, tagged
        names = ", ".join(sorted({signal.Signals(s).name for s in signums if s}))
        cancelled = slurm_job_cancelled()
        logger.warning(
            "%s during the final evaluation (%s): training is complete, checkpoint %s; "
            "--resume evaluates it without training", _stopped(cancelled), names, path,
        )  # fmt: skip
        self.raised = Preempted(self.trainer.iter, path, cancelled)
        raise_from_handler(self.raised)

    def before_train(self):
        if not self._signals:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning("Not in the main thread: pre-emption signals are not caught")
            return
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def after_step(self):
        if not self.trainer.loop.stop_agreed:
            return
        iteration = self.trainer.iter
        checkpointer = self.trainer.checkpointer
        name = f"model_{iteration:07d}"
        path = os.path.join(checkpointer.save_dir, name + ".pth")
        cancelled = False
        if comm.is_main_process():
            checkpointer.save(name, iteration=iteration)
            cancelled = slurm_job_cancelled()
            signals = ", ".join(sorted({signal.Signals(s).name for s in self.trainer.loop.stop_signals if s}))
            logger.warning(
                "%s at iteration %d (%s): checkpoint %s; --resume continues at iteration %d",
                _stopped(cancelled), iteration, signals, path, iteration + 1,
            )  # fmt: skip
        # no rank exits before the checkpoint is complete; all end as the main one says
        cancelled = comm.all_gather(cancelled)[0] if comm.get_world_size() > 1 else cancelled
        raise Preempted(iteration, path, cancelled)

    def after_train(self):
        if not self._previous or self.trainer.iter < self.trainer.max_iter:
            return  # no handlers, or training did not finish
        # before the evaluation hook's after_train: from here a signal abandons it
        self._training_done = True
        signum = self.trainer.loop.stop_requested
        if signum:  # it came after the last step's all-gather
            self._stop_after_training([signum])

    def restore_signals(self) -> None:
        """Put back the handlers that :meth:`before_train` replaced."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
        self._training_done = False


def _stopped(cancelled: bool) -> str:
    return "cancelled (scancel: the job is not requeued)" if cancelled else "pre-empted"
