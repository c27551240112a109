"""``OUTPUT_DIR/run_summary.json``: a run's facts as data, beside ``metrics.json``.

What a plot, a study or a person needs from a run without reading its log: the batch
plan (global batch, world size, images per pass, K, the ramp's stages), the LR (peak,
scaling rule, reference), the warm-up, the run's steps, images and epochs, the optimizer,
model EMA, and for each invocation (a resumed run has several) its first and last step,
wall-clock, the part of it spent evaluating (the evaluation hook's, periodic and final),
images per second of training (the images over the wall-clock less the evaluations) and
how it ended: ``running`` (written at start),
``finished``, ``preempted``, ``cancelled`` (Slurm's ``scancel``: stopped as a pre-emption,
not requeued), ``diverged`` (a non-finite or exploding loss), ``failed``
(another error), ``interrupted`` (Ctrl-C) or ``killed`` (it ended without a word, SIGKILL or
the out-of-memory killer: recorded so by the next invocation, its ``end_iter`` where that one
starts). Written by the main process, atomically, at start, at each periodic checkpoint
(``SOLVER.CHECKPOINT_PERIOD``: a ``running`` record's ``timed_to_iter``, the steps its wall
clock covers) and at the end of each invocation. A killed invocation keeps the wall clock of
the steps the next one resumes after (its record at that checkpoint); where its last record
does not reach that step (a kill between a checkpoint and its record), its times are
``null``: unknown, never a part taken for the whole.

``OUTPUT_DIR/eval_results.json``: what an ``--eval-only`` run measured, the evaluation
results as the training scripts return them (``{"bbox": {"AP": ...}}`` for one test set,
``{<dataset>: {"bbox": ...}, ...}`` for several), written by the main process, atomically;
a NaN (Detectron2's AP of a category without ground truth) is written as ``null``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import numbers
import os
import time
from typing import Any, Dict, Optional, Tuple

from detectron2.engine import HookBase
from detectron2.engine.hooks import EvalHook, PeriodicCheckpointer
from detectron2.utils import comm

from ..checkpoint import DiskFullError, is_disk_full, last_checkpoint_state
from .elastic import LostProcessError, is_lost_process
from .preemption import Diverged, Preempted, PreemptionHook


__all__ = [
    "EVAL_RESULTS_FILE",
    "SUMMARY_FILE",
    "RunEnd",
    "RunSummaryHook",
    "how_it_ended",
    "read_eval_results",
    "read_run_summary",
    "run_after_train_hooks",
    "training_seconds",
    "write_eval_results",
]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "run_summary.json"
EVAL_RESULTS_FILE = "eval_results.json"


def _json_safe(data: Any) -> Any:
    """``data`` with numpy scalars as Python numbers and NaN and infinities as None: JSON
    has no NaN (Python's ``json`` would write a bare ``NaN``, which other readers refuse)."""
    if isinstance(data, dict):
        return {k: _json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_json_safe(v) for v in data]
    if isinstance(data, (bool, int, str)) or data is None:
        return data
    if isinstance(data, numbers.Integral):
        return int(data)
    if isinstance(data, numbers.Real):
        value = float(data)
        return value if math.isfinite(value) else None
    return data


def _write_json(path: str, data: Any) -> None:
    """Write ``data`` (:func:`_json_safe`) to ``path`` atomically. Where the disk is full, the
    file is overwritten in place instead (its blocks are reused, so a summary of about its
    old size still fits); :class:`~largedet.checkpoint.DiskFullError` when that fails too."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    text = json.dumps(_json_safe(data), indent=1, allow_nan=False).encode()
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
        return
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if not is_disk_full(e):
            raise
    try:
        with open(path, "r+b") as f:
            f.write(text)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if not is_disk_full(e) and not isinstance(e, FileNotFoundError):
            raise
        output_dir = os.path.dirname(path) or "."
        error = DiskFullError(f"{path}: no space left on the device; {last_checkpoint_state(output_dir)}")
        error.errno = errno.ENOSPC
        raise error from None


def write_eval_results(output_dir: str, results: Dict[str, Any]) -> None:
    """Write ``results`` to ``output_dir/eval_results.json`` (main process only)."""
    if comm.is_main_process() and output_dir:
        _write_json(os.path.join(output_dir, EVAL_RESULTS_FILE), results)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def read_eval_results(output_dir: str) -> Optional[Dict[str, Any]]:
    """The results an ``--eval-only`` run wrote to ``output_dir``, or None when it wrote none."""
    return _read_json(os.path.join(output_dir, EVAL_RESULTS_FILE))


def read_run_summary(output_dir: str) -> Optional[Dict[str, Any]]:
    """The summary of the run in ``output_dir``, or None when it has none."""
    return _read_json(os.path.join(output_dir, SUMMARY_FILE))


def training_seconds(output_dir: str) -> Optional[float]:
    """The training time of the run in ``output_dir``: each invocation's wall clock less its
    evaluation, summed over the invocations of its summary; None where one of them was not
    timed (a killed invocation whose time is unknown: the sum would leave its steps out) or
    there is no summary."""
    invocations = (read_run_summary(output_dir) or {}).get("invocations") or []
    if not invocations or any(i.get("wall_clock_s") is None for i in invocations):
        return None
    return sum(i["wall_clock_s"] - (i.get("evaluation_s") or 0.0) for i in invocations)


class RunEnd:
    """How one invocation of training ended, in one place: the training loop starts it
    (:meth:`start`) and sets it (:meth:`finish`, :meth:`record`), the end-of-run policy
    (:func:`run_after_train_hooks`) may amend it, and the :class:`RunSummaryHook` it is
    given writes it. ``status`` is None while the loop runs, then one of ``finished``,
    ``preempted``, ``cancelled``, ``diverged``, ``failed``, ``lost_process`` or
    ``interrupted``."""

    def __init__(self):
        self.status: Optional[str] = None

    def start(self) -> None:
        self.status = None

    def finish(self) -> None:
        self.status = "finished"

    def record(
        self, error: BaseException, iteration: int, output_dir: str, distributed: bool, log
    ) -> BaseException:
        """Set the status of a loop that raised ``error`` at ``iteration``
        (:func:`how_it_ended`) and return what to raise in its place."""
        self.status, raised = how_it_ended(error, iteration, output_dir, distributed, log)
        return raised


class RunSummaryHook(HookBase):
    """Writes :data:`SUMMARY_FILE` (see the module docstring) from the trainer's run plan
    (``trainer.plan``, :class:`~largedet.solver.plan.RunPlan`) and config; the invocation's
    end status is that of ``end``, the trainer's :class:`RunEnd`."""

    def __init__(self, end: RunEnd):
        self.end = end
        self._start = 0.0
        self._start_iter = 0
        self._start_position = 0
        self._start_evaluation = 0.0

    def _facts(self) -> Dict[str, Any]:
        t = self.trainer
        plan = t.plan  # built once by the trainer
        cfg, batch, schedule, scaling = t.cfg, plan.batch, plan.schedule, plan.lr
        return {
            "batch": {
                "global_batch": batch.global_batch,
                "world_size": batch.world_size,
                "per_device": batch.per_device,
                "accumulation": batch.accumulation,
                "ramp": [
                    {"batch": s.batch, "accumulation": s.accumulation, "first_step": s.first_step,
                     "steps": s.steps, "first_image": s.first_image}
                    for s in schedule.stages
                ] if schedule.ramped else [],
            },  # fmt: skip
            "lr": {
                "peak": scaling.lr,
                "rule": scaling.rule,
                "reference_lr": scaling.reference_lr,
                "reference_batch": scaling.reference_batch,
                "schedule": cfg.SOLVER.LR_SCHEDULER_NAME,
            },
            "warmup_iters": plan.warmup_iters,
            "warmup_images": plan.warmup_images,
            "optimizer": cfg.SOLVER.OPTIMIZER,
            "iterations": t.max_iter,
            "images": plan.images_trained,
            "dataset_size": plan.dataset_size,
            "epochs": plan.images_trained / plan.dataset_size if plan.dataset_size else None,
            "model_ema": t.ema.describe(batch.global_batch) if t.ema is not None else None,
        }

    def _write(self, status: str, timed_to: Optional[int] = None) -> None:
        """Write this invocation's record with ``status``; a ``running`` record carries
        ``timed_to_iter``, the first step its wall clock does not cover (``timed_to``, or
        the invocation's first step at its start)."""
        if not comm.is_main_process() or not self.trainer.cfg.OUTPUT_DIR:
            return
        output_dir = self.trainer.cfg.OUTPUT_DIR
        summary = read_run_summary(output_dir) or {}
        invocations = summary.get("invocations", [])
        wall = time.perf_counter() - self._start
        evaluation = self.trainer.evaluation.seconds - self._start_evaluation
        training = wall - evaluation
        images = self.trainer.data.position - self._start_position
        current = {
            "start_iter": self._start_iter,
            # the first step not trained: a pre-empted step was finished and saved
            "end_iter": min(self.trainer.iter + (status in ("preempted", "cancelled")), self.trainer.max_iter),
            "wall_clock_s": round(wall, 3),
            "evaluation_s": round(evaluation, 3),
            "images_per_s": round(images / training, 3) if training > 0 and images else None,
            "status": status,
        }
        if status == "running":
            current["timed_to_iter"] = current["end_iter"] = self._start_iter if timed_to is None else timed_to
        if invocations and invocations[-1]["status"] == "running" and invocations[-1]["start_iter"] == self._start_iter:
            invocations[-1] = current  # this invocation's start record
        else:
            invocations.append(current)
        summary = {**self._facts(), "status": status, "invocations": invocations,
                   "wall_clock_s": round(sum(i["wall_clock_s"] or 0.0 for i in invocations), 3)}  # fmt: skip
        _write_json(os.path.join(output_dir, SUMMARY_FILE), summary)

    def _close_killed(self) -> None:
        """An earlier invocation still ``running`` ended without a word (SIGKILL, the
        out-of-memory killer, a machine lost): record it as ``killed``, its steps kept up
        to where this one starts, with a warning."""
        output_dir = self.trainer.cfg.OUTPUT_DIR
        if not comm.is_main_process() or not output_dir:
            return
        summary = read_run_summary(output_dir) or {}
        invocations = summary.get("invocations", [])
        if not invocations or invocations[-1].get("status") != "running":
            return
        last = invocations[-1]
        if last.pop("timed_to_iter", None) != self._start_iter:
            # its last record does not cover the steps kept: their time is unknown
            last.update(wall_clock_s=None, evaluation_s=None, images_per_s=None)
        last.update(status="killed", end_iter=self._start_iter)
        logger.warning(
            "The previous invocation (from iteration %d) ended without a word (SIGKILL, the "
            "out-of-memory killer, a lost machine): recorded as killed; this one continues at "
            "iteration %d", last.get("start_iter", 0), self._start_iter,
        )  # fmt: skip
        _write_json(os.path.join(output_dir, SUMMARY_FILE), {**summary, "status": "killed"})

    def before_train(self):
        self._start = time.perf_counter()
        self._start_iter = self.trainer.start_iter
        self._start_position = self.trainer.data.position
        self._start_evaluation = self.trainer.evaluation.seconds
        self._close_killed()
        self._write("running")

    def after_step(self):
        # the periodic checkpointer saves after this step: a kill from here on resumes at
        # ``next_iter``, and this record times the steps before it
        period, next_iter = self.trainer.cfg.SOLVER.CHECKPOINT_PERIOD, self.trainer.iter + 1
        if period > 0 and next_iter % period == 0 and next_iter < self.trainer.max_iter:
            self._write("running", timed_to=next_iter)

    def after_train(self):
        self._write(self.end.status or "failed")


def _tagged_checkpoint(output_dir: str) -> str:
    """The checkpoint ``output_dir``'s ``last_checkpoint`` names, where it exists ("" else)."""
    try:
        with open(os.path.join(output_dir, "last_checkpoint")) as f:
            path = os.path.join(output_dir, f.read().strip())
    except OSError:
        return ""
    return path if os.path.isfile(path) else ""


def how_it_ended(
    error: BaseException, iteration: int, output_dir: str, distributed: bool, log
) -> Tuple[str, BaseException]:
    """How a training loop that raised ``error`` at ``iteration`` ended, for the run
    summary, and what to raise in its place: ``("preempted", error)`` (``"cancelled"`` for
    Slurm's cancel) for :class:`~largedet.launch.preemption.Preempted`; ``"diverged"`` for a non-finite or
    exploding loss (``FloatingPointError``: one logged line, raised as :class:`Diverged`); ``"failed"`` for a
    full disk (one line, and another library's ``OSError`` ENOSPC as a
    :class:`~largedet.checkpoint.DiskFullError` naming the last checkpoint) and any other
    error (logged with its traceback); ``"lost_process"`` for a failed collective of a
    distributed job (a :class:`~largedet.launch.elastic.LostProcessError` in one line);
    ``"interrupted"`` for anything else (Ctrl-C). Called inside the ``except`` block, so
    that ``log`` (the loop's logger) writes the traceback."""
    if isinstance(error, Preempted):
        return error.status, error
    if isinstance(error, FloatingPointError):
        message = str(error)
        if not message.startswith("Training diverged"):  # a check in the model's forward pass
            message = (f"Training diverged at iteration {iteration}: {' '.join(message.split())} (a check "
                       f"in the model's forward pass). Last good checkpoint: {_tagged_checkpoint(output_dir) or 'none'}")  # fmt: skip
        log.error("%s; lower SOLVER.BASE_LR, or see SOLVER.DIVERGENCE.ROLLBACK", message)
        return "diverged", Diverged(message)
    if isinstance(error, DiskFullError):
        log.error("%s", error)
        return "failed", error
    if not isinstance(error, Exception):
        return "interrupted", error
    if distributed and is_lost_process(error):
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        lost = LostProcessError(
            f"iteration {iteration}: a collective failed, a process of the job was lost "
            f"({first_line}); {last_checkpoint_state(output_dir)}"
        )
        log.error("%s", lost)
        return "lost_process", lost
    if not is_disk_full(error):
        log.exception("Exception during training:")
        return "failed", error
    full = DiskFullError(  # a write of Detectron2's or another library's
        f"{error.filename or output_dir}: no space left on the device "
        f"({error.strerror}); training stopped; {last_checkpoint_state(output_dir)}"
    )
    full.errno = error.errno
    log.error("%s", full)
    return "failed", full


def run_after_train_hooks(end: RunEnd, hooks) -> None:
    """Every hook's ``after_train`` in order, with the end-of-run policy of largedet's
    ``Trainer.after_train``: a :class:`~largedet.launch.preemption.Preempted` or a
    :class:`~largedet.checkpoint.DiskFullError` in one hook lets the later ones run before it
    is raised (``end``, the run's :class:`RunEnd`, says so); after a run that stopped on an
    error, another hook's error is one line; after a lost process, no evaluation and no
    checkpoint. The pre-emption handlers are put back at the end."""
    lost = end.status == "lost_process"
    stopped = None
    try:
        for hook in hooks:
            if lost and isinstance(hook, (EvalHook, PeriodicCheckpointer)):
                continue
            try:
                hook.after_train()
            except (Preempted, DiskFullError) as e:
                if isinstance(e, Preempted):
                    end.status = e.status
                elif end.status not in ("preempted", "cancelled"):
                    end.status = "failed"
                stopped = stopped or e
            except Exception as e:
                raised = _raised_by_a_signal(hooks)
                if raised is not None:  # the handler's stop, turned into another error by
                    end.status = raised.status  # the code it interrupted
                    stopped = stopped or raised
                    continue
                if end.status == "finished":
                    raise
                # the run stopped already, for a reason that is being raised: say this
                # one in a line, and let the later hooks record how the run ended
                logger.warning("%s.after_train failed after the run stopped: %s: %s",
                               type(hook).__name__, type(e).__name__, e)  # fmt: skip
    finally:
        for hook in hooks:
            if isinstance(hook, PreemptionHook):
                hook.restore_signals()
    if stopped is not None:
        raise stopped


def _raised_by_a_signal(hooks) -> Optional[Preempted]:
    """The :class:`~largedet.launch.preemption.Preempted` that a signal during this run's
    final evaluation raised, if any (its :class:`PreemptionHook`'s)."""
    return next((hook.raised for hook in hooks if isinstance(hook, PreemptionHook) and hook.raised), None)
