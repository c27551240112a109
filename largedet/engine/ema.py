"""Model EMA: an exponential moving average of the weights, updated once per optimizer step.

For optimizer step t (1-based) with global batch B_t, every floating-point parameter w::

    d_t     = d_ref ** (B_t / B_ref)             the per-step decay (Busbridge et al., NeurIPS
                                                 2023: the same decay per image at any batch)
    ema_t   = d_t * ema_{t-1} + (1 - d_t) * w_t  ema_0 = w_0, the weights training starts from

``d_ref`` is the decay per step at the reference batch ``B_ref`` (``MODEL_EMA.DECAY`` at
``MODEL_EMA.REFERENCE_BATCH``; ``REFERENCE_BATCH`` 0 takes ``DECAY`` per step at any
batch). Buffers: floating-point ones (BN's running mean and variance) are averaged the
same way with ``buffers="average"`` or copied from the model after each step with
``"copy"``; integer ones (BN's ``num_batches_tracked``) are always copied.

The update is one fused ``torch._foreach_lerp_`` per kind of tensor, on the weights'
device, with the decay a Python float: no host sync. Under DDP every rank holds the same
weights after a step, so every rank's average is the same (buffers are the rank's own,
as the model's are; checkpoints hold rank 0's). Under AMP the average is of the float32
weights the optimizer updates.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from detectron2.engine import HookBase
from torch import Tensor, nn

from ..config import BUFFER_MODES, EMA_EVAL_MODES

__all__ = ["TRAINED_WEIGHTS_DIR", "EMAHook", "Evaluation", "ModelEMA", "evaluate_with_ema", "per_step_decay"]

logger = logging.getLogger(__name__)



def per_step_decay(decay: float, batch: int, reference_batch: int) -> float:
    """``decay ** (batch / reference_batch)``; ``decay`` itself when ``reference_batch`` is 0.
    ``MODEL_EMA.DECAY`` and ``REFERENCE_BATCH`` are checked against their declared rules."""
    return decay if reference_batch == 0 else decay ** (batch / reference_batch)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class ModelEMA:
    """The moving average of a model's weights (see the module docstring).

    Args:
        model: the model (DDP-wrapped or not) whose weights are averaged; the average
            starts as a copy of its current weights.
        decay: ``d_ref``, the per-step decay at ``reference_batch``, in [0, 1).
        reference_batch: ``B_ref``; 0: ``decay`` is the per-step decay at any batch.
        buffers: "average" or "copy" (floating-point buffers; integer ones are copied).
    """

    def __init__(self, model: nn.Module, decay: float, reference_batch: int = 0, buffers: str = "average"):
        per_step_decay(decay, 1, reference_batch)  # checks the numbers
        if buffers not in BUFFER_MODES:
            raise ValueError(f"MODEL_EMA.BUFFERS must be one of {BUFFER_MODES}, got {buffers!r}")
        self.decay, self.reference_batch, self.buffers = decay, reference_batch, buffers
        self.updates = 0  # optimizer steps averaged so far
        # False until reset() or load_state_dict(): the trainer starts the average from the
        # weights training starts with (after MODEL.WEIGHTS or a resume loaded them)
        self.started = False
        self.weights: Dict[str, Tensor] = {
            name: t.detach().clone() for name, t in self._named_tensors(model)
        }

    @staticmethod
    def _named_tensors(model: nn.Module) -> Iterator[Tuple[str, Tensor]]:
        model = _unwrap(model)
        yield from model.named_parameters()
        yield from model.named_buffers()

    def _pairs(self, model: nn.Module) -> Tuple[List[Tensor], List[Tensor], List[Tensor], List[Tensor]]:
        """(averaged, model) tensors to lerp and (averaged, model) tensors to copy."""
        lerp_avg, lerp_model, copy_avg, copy_model = [], [], [], []
        parameters = {name for name, _ in _unwrap(model).named_parameters()}
        for name, t in self._named_tensors(model):
            avg = self.weights.get(name)
            if avg is None:
                raise KeyError(f"model EMA: the model has a tensor {name!r} that the average lacks")
            averaged = t.is_floating_point() and (name in parameters or self.buffers == "average")
            (lerp_avg if averaged else copy_avg).append(avg)
            (lerp_model if averaged else copy_model).append(t.detach())
        return lerp_avg, lerp_model, copy_avg, copy_model

    def decay_at(self, batch: int) -> float:
        """The per-step decay ``d_t`` for a step of global batch ``batch``."""
        return per_step_decay(self.decay, batch, self.reference_batch)

    @torch.no_grad()
    def reset(self, model: nn.Module) -> None:
        """Start the average again from ``model``'s current weights."""
        for name, t in self._named_tensors(model):
            self.weights[name].copy_(t.detach())
        self.updates = 0
        self.started = True

    @torch.no_grad()
    def update(self, model: nn.Module, batch: int) -> None:
        """One optimizer step's update for a step of global batch ``batch``."""
        lerp_avg, lerp_model, copy_avg, copy_model = self._pairs(model)
        weight = 1.0 - self.decay_at(batch)
        if lerp_avg:
            torch._foreach_lerp_(lerp_avg, lerp_model, weight)
        if copy_avg:
            torch._foreach_copy_(copy_avg, copy_model)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self, model: nn.Module):
        """Inside the block ``model`` holds the averaged weights; its own come back after."""
        own = [(t, t.detach().clone()) for _, t in self._named_tensors(model)]
        with torch.no_grad():
            for name, t in self._named_tensors(model):
                t.copy_(self.weights[name])
        try:
            yield model
        finally:
            with torch.no_grad():
                for t, saved in own:
                    t.copy_(saved)

    def state_dict(self) -> dict:
        return {
            "weights": dict(self.weights),
            "updates": self.updates,
            "decay": self.decay,
            "reference_batch": self.reference_batch,
            "buffers": self.buffers,
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Load the average (its tensors bit for bit); the decay settings stay this run's."""
        missing = sorted(set(self.weights) - set(state["weights"]))
        if missing:
            raise KeyError(f"model EMA: the checkpoint's average lacks {missing[:3]} ({len(missing)} tensors)")
        for name, t in self.weights.items():
            t.copy_(state["weights"][name])
        self.updates = int(state["updates"])
        self.started = True
        if (state.get("decay"), state.get("reference_batch")) != (self.decay, self.reference_batch):
            logger.warning(
                "Model EMA: the checkpoint's average was made with decay %s at batch %s; "
                "it goes on with decay %s at batch %s",
                state.get("decay"), state.get("reference_batch"), self.decay, self.reference_batch,
            )  # fmt: skip

    @classmethod
    def from_config(cls, cfg, model: nn.Module) -> Optional["ModelEMA"]:
        """The average ``cfg.MODEL_EMA`` asks for, or None when it is disabled."""
        ema = cfg.MODEL_EMA
        if not ema.ENABLED:
            return None
        return cls(model, ema.DECAY, ema.REFERENCE_BATCH, ema.BUFFERS)

    def describe(self, batch: int) -> str:
        """One line for the start-of-run block."""
        d = self.decay_at(batch)
        reference = (
            f"{self.decay:g} per step at batch {self.reference_batch} = {d:.6g} per step at batch {batch}"
            if self.reference_batch
            else f"{d:g} per step"
        )
        horizon = 1.0 / (1.0 - d) if d < 1 else math.inf
        return (
            f"model EMA: decay {reference} (an average over ~{horizon:.0f} steps); "
            f"floating-point buffers {'averaged' if self.buffers == 'average' else 'copied'}"
        )


class EMAHook(HookBase):
    """Updates the trainer's :class:`ModelEMA` after each optimizer step.

    It sits after the divergence guard, so a step that was rolled back is not averaged,
    and before the checkpointer and the evaluation, which then see the step's average.
    ``batch_at(iteration)`` gives the global batch of a step (fixed, or a batch ramp's).
    Before training, an average that neither a resume nor ``reset`` started is started
    from the model's weights (those of ``MODEL.WEIGHTS``).
    """

    def __init__(self, ema: ModelEMA, batch_at):
        self.ema = ema
        self._batch_at = batch_at

    def before_train(self):
        if not self.ema.started:
            if self.trainer.start_iter > 0:
                logger.warning(
                    "Model EMA: the checkpoint resumed from holds no average; it starts "
                    "again from the weights at iteration %d", self.trainer.start_iter,
                )  # fmt: skip
            self.ema.reset(self.trainer.model)

    def after_step(self):
        self.ema.update(self.trainer.model, self._batch_at(self.trainer.iter))


#: The subfolder of ``OUTPUT_DIR`` that the trained weights' evaluation writes to with
#: ``MODEL_EMA.EVAL both`` (its results files, ``inference/coco_instances_results.json``):
#: the average's evaluation keeps ``OUTPUT_DIR/inference``.
TRAINED_WEIGHTS_DIR = "model"


def evaluate_with_ema(test, cfg, model: nn.Module, ema: Optional[ModelEMA], mode: str) -> dict:
    """``test(cfg, model)`` on the weights ``mode`` names: "ema" the average (its results
    as the run's), "model" the trained weights, "both" the average's results with the
    trained weights' added under ``model/`` (``model/<dataset>/bbox/AP`` in the metrics).
    Without an average (``ema`` None) the trained weights. With "both" each evaluation
    writes its own files: the average's to ``OUTPUT_DIR/inference`` as usual, the trained
    weights' to ``OUTPUT_DIR/model/inference`` (``test`` is given a copy of ``cfg`` whose
    ``OUTPUT_DIR`` is ``OUTPUT_DIR/model``)."""
    if mode not in EMA_EVAL_MODES:
        raise ValueError(f"MODEL_EMA.EVAL must be one of {EMA_EVAL_MODES}, got {mode!r}")
    if ema is None or mode == "model":
        return test(cfg, model)
    with ema.applied(model):
        results = test(cfg, model)
    if mode == "ema":
        return results
    trained = test(_trained_weights_cfg(cfg), model)
    return {**results, **{f"model/{name}": value for name, value in trained.items()}}


def _trained_weights_cfg(cfg):
    """``cfg`` with ``OUTPUT_DIR`` the trained weights' own folder (:data:`TRAINED_WEIGHTS_DIR`)."""
    out = cfg.clone()
    out.defrost()
    out.OUTPUT_DIR = os.path.join(cfg.OUTPUT_DIR, TRAINED_WEIGHTS_DIR)
    out.freeze()
    return out


class Evaluation:
    """The evaluation of a run's model by ``test`` (``test(cfg, model)``, the parts'): the
    weights ``MODEL_EMA.EVAL`` names (the trained ones without a model EMA), its
    wall-clock summed in :attr:`seconds` (left out of the images per second) and its last
    results in :attr:`last_results` (None until one ran)."""

    def __init__(self, test, cfg, model, ema: Optional[ModelEMA]):
        self._test, self._cfg, self._model, self._ema = test, cfg, model, ema
        #: seconds this process spent evaluating (periodic and final evaluations)
        self.seconds = 0.0
        self.last_results: Optional[dict] = None

    def __call__(self) -> dict:
        start = time.perf_counter()
        try:
            self.last_results = evaluate_with_ema(
                self._test, self._cfg, self._model, self._ema, self._cfg.MODEL_EMA.EVAL
            )
        finally:
            self.seconds += time.perf_counter() - start
        return self.last_results
