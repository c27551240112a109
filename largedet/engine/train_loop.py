"""One optimizer step over K accumulated micro-batches, in full or mixed precision."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from detectron2.engine import SimpleTrainer
from detectron2.utils import comm
from detectron2.utils.events import get_event_storage
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..optim import AGVM, uses_clock
from ..optim.agvm import Estimate, complete_estimates, micro_batch_halves, rank_halves
from ..solver.batch import check_agvm_estimates
from ..solver.plan import ParameterClip, StepPlan

__all__ = ["AccumulationTrainer", "Gradients", "StepPlan", "StepSync", "total_norm"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepSync:
    """What each rank sends the others once per step, in the step's one collective (the
    metrics all-gather of :meth:`AccumulationTrainer.step_optimizer`): sharing it keeps one
    host sync per step."""

    metrics: List[float]  # the step's losses (averaged over its micro-batches), then its gradient norm
    data_time: float  # seconds this rank waited for its K batches
    stop_request: int  # the signal this rank was asked to stop by (0: none)


@dataclass
class Gradients:
    """What the backward passes of a step (:meth:`AccumulationTrainer.backward`) leave for its
    optimizer step (:meth:`AccumulationTrainer.step_optimizer`)."""

    losses: Dict[str, Tensor]  # each loss averaged over the K micro-batches, on the device
    data_time: float  # seconds this rank waited for its K batches
    estimates: Optional[list] = None  # AGVM's two gradient estimates, at the steps it measures


class AccumulationTrainer(SimpleTrainer):
    """Detectron2's ``SimpleTrainer`` (and ``AMPTrainer``) with gradient accumulation.

    Each :meth:`run_step` is one optimizer step. It draws ``accumulation_steps`` (K)
    batches from the data loader, and for each runs the forward pass and the backward
    pass of ``loss / K``, so that the summed gradient is the mean over the K
    micro-batches: with losses that are means over images, exactly the gradient of one
    batch K times larger. Under DDP the first K - 1 backward passes run in
    ``model.no_sync()``, so gradients are all-reduced once per step. Then the hooks'
    ``after_backward``, one metrics record (each loss averaged over the micro-batches and
    the ranks) and one optimizer step. The two halves are public (:meth:`backward`,
    :meth:`step_optimizer`), so that a trainer that wraps this one (largedet's ``Trainer``,
    as Detectron2's ``DefaultTrainer`` wraps ``SimpleTrainer``) runs its own hooks'
    ``after_backward`` between them.

    Mixed precision: ``amp_dtype`` ``torch.float16`` runs the forward passes under
    autocast and scales the loss with ``grad_scaler`` (created when not given), which
    unscales the summed gradients once per step, before the optimizer (and its gradient
    clipping) sees them; ``torch.bfloat16`` needs no scaler. ``amp_dtype`` None is full
    precision.

    AGVM (``agvm``, :class:`~largedet.optim.AGVM`): at the steps where it estimates, the
    two gradient estimates of the step are, with K >= 2, the sum of the first ``K // 2``
    micro-batches' gradients (a copy taken after them) and the rest (full minus that
    copy), each averaged over ranks (the copy by one extra all-reduce); with K = 1 under
    DDP, the mean gradient of the first ``world_size // 2`` ranks and that of the others
    (the step's backward pass then runs in ``no_sync()`` and its gradients are averaged
    by this trainer: all ranks in one all-reduce, plus the first half's). The gradient
    the optimizer sees is the usual one either way. Then, after the ``after_backward``
    hooks: AGVM's update of ``mu`` and its ``agvm/phi/<part>``, ``agvm/mu/<part>``
    scalars and the optimizer step with each group's LR times its part's ``mu``.

    Gradient clipping, the one path of a run's: the step's total L2 norm to
    ``clip_max_norm`` (the run plan's bound for the step: ``SOLVER.WARMUP_CLIP``, AGVM's
    window, ``SOLVER.CLIP_GRADIENTS`` "full_model"), then ``parameter_clip``
    (``SOLVER.CLIP_GRADIENTS`` "value" or "norm"), on the device, without a host sync.

    Non-finite gradients: after the ``after_backward`` hooks, the global L2 norm of the
    step's gradient (after unscaling) is computed by one fused reduction and read back
    with the losses, in the one host sync per step that the metrics need anyway. When it
    is not finite the step is skipped: the weights, the optimizer's state and AGVM's
    ``mu`` stay as they were (with a gradient scaler, the scaler's step skips it and
    lowers the scale, as fp16 training expects; without one a warning is logged, and
    largedet's ``DivergenceGuard`` treats the step as diverged).

    After each step, :attr:`last_losses` holds the step's losses (floats averaged over
    micro-batches and ranks, identical on every rank), :attr:`last_total_loss` their sum
    and :attr:`last_grad_norm` the gradient's norm (the largest over ranks; NaN or inf
    when the step was skipped).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data_loader,
        optimizer: torch.optim.Optimizer,
        accumulation_steps: int = 1,
        *,
        amp_dtype: Optional[torch.dtype] = None,
        grad_scaler: Optional[torch.amp.GradScaler] = None,
        agvm: Optional[AGVM] = None,
        parameter_clip: Optional[ParameterClip] = None,
    ):
        super().__init__(model, data_loader, optimizer)
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        if amp_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(
                f"amp_dtype must be None, torch.float16 or torch.bfloat16, got {amp_dtype}"
            )
        self.accumulation_steps = accumulation_steps
        self.amp_dtype = amp_dtype
        self.device_type = next(model.parameters()).device.type
        if amp_dtype == torch.float16 and grad_scaler is None:
            grad_scaler = torch.amp.GradScaler(self.device_type)
        self.grad_scaler = grad_scaler
        self.agvm = agvm
        if agvm is not None:
            check_agvm_estimates(accumulation_steps, comm.get_world_size())
        self.last_losses: Dict[str, float] = {}
        self.last_total_loss = float("nan")
        self.last_grad_norm = float("nan")
        # pre-emption (largedet.launch.preemption): the signal this rank got (0: none), and
        # whether any rank had one at the last step, learnt in the metrics' all-gather
        self._stop_signal = 0
        self.stop_agreed = False
        self.stop_signals: List[int] = []
        # the step's total-norm clip (the run plan's, set per step by run_planned_step):
        # None for no clipping; the per-parameter clip of every step
        self.clip_max_norm: Optional[float] = None
        self.parameter_clip = parameter_clip

    def start_data_stream(self) -> None:
        """Make the data loader's iterator now, before the first step: the loader draws its
        base seed from torch's global generator when the iterator is made, which must not
        fall inside a step (a run resumed at step n would draw it in step n, an
        uninterrupted one in step 0)."""
        self._data_loader_iter  # noqa: B018  (SimpleTrainer's iterator, made on first use)

    def request_stop(self, signum: int) -> None:
        """Ask every rank to stop after the step in whose metrics all-gather this rank's
        request is seen (:attr:`stop_agreed`); safe to call from a signal handler."""
        self._stop_signal = int(signum)

    @property
    def stop_requested(self) -> int:
        """The signal this rank was asked to stop by (0: none)."""
        return self._stop_signal

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.amp_dtype)

    def _sync_context(self, last: bool):
        if last or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def set_step(self, iteration: int, step: StepPlan) -> None:
        """Make the next step optimizer step ``iteration`` as ``step`` asks: its K, its
        total-norm clip and, where given, the clock of an optimizer that uses one (PMD-LAMB's
        period in images under a batch ramp, :meth:`~largedet.optim.PMDLAMB.set_clock`;
        :func:`~largedet.optim.uses_clock`)."""
        self.iter = iteration
        self.accumulation_steps = step.accumulation
        self.clip_max_norm = step.clip_max_norm
        if step.clock is not None and uses_clock(self.optimizer):
            self.optimizer.set_clock(step.clock)

    def run_planned_step(self, iteration: int, step: StepPlan) -> None:
        """Run optimizer step ``iteration`` as ``step`` asks (:meth:`set_step`)."""
        self.set_step(iteration, step)
        self.run_step()

    def run_step(self) -> None:
        """The K backward passes, this trainer's hooks' ``after_backward``, the optimizer step."""
        gradients = self.backward()
        self.after_backward()
        self.step_optimizer(gradients)

    def backward(self) -> Gradients:
        """The step's K forward and backward passes (gradients summed, all-reduced once), AGVM's
        two estimates where it measures, the gradient scaler's unscaling."""
        assert self.model.training, "[AccumulationTrainer] model was changed to eval mode!"
        k = self.accumulation_steps
        estimate = self.agvm is not None and self.agvm.estimates_at(self.iter)
        split_ranks = estimate and k == 1  # the two estimates are two halves of the ranks
        first_half: Optional[List[Optional[Tensor]]] = None
        data_time = 0.0
        step_losses: Dict[str, torch.Tensor] = {}
        for i in range(k):
            start = time.perf_counter()
            data = next(self._data_loader_iter)
            data_time += time.perf_counter() - start
            with self._sync_context(last=i == k - 1 and not split_ranks):
                with self._autocast():
                    loss_dict = self.model(data)
                    if isinstance(loss_dict, torch.Tensor):
                        loss_dict = {"total_loss": loss_dict}
                    losses = sum(loss_dict.values())
                if i == 0:
                    self.optimizer.zero_grad()
                scaled = losses / k
                if self.grad_scaler is not None:
                    scaled = self.grad_scaler.scale(scaled)
                scaled.backward()
            for name, value in loss_dict.items():
                value = value.detach().float() / k
                step_losses[name] = step_losses[name] + value if name in step_losses else value
            if estimate and not split_ranks and i == k // 2 - 1:
                first_half = [_copy(p.grad) for p in self.agvm.params]

        estimates = None
        if estimate:
            estimates = self._rank_halves() if split_ranks else self._micro_batch_halves(first_half)
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
            get_event_storage().put_scalar(
                "grad_scaler", self.grad_scaler.get_scale(), smoothing_hint=False
            )
        return Gradients(step_losses, data_time, estimates)

    def step_optimizer(self, gradients: Gradients) -> None:
        """The metrics record, then the optimizer step: skipped for a non-finite gradient,
        after the clipping, with AGVM's update of ``mu`` and its modulated LR."""
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = total_norm([g for g in grads if g is not None])
        self._write_metrics(gradients.losses, gradients.data_time, grad_norm=grad_norm)
        if not math.isfinite(self.last_grad_norm):
            self._skip_step()
            return
        present = [g for g in grads if g is not None]
        if self.clip_max_norm is not None and present:
            _clip(present, grad_norm, self.clip_max_norm)
        if self.parameter_clip is not None and present:
            clip_each_parameter(present, self.parameter_clip)
        if self.agvm is None:
            self._optimizer_step()
            return
        if gradients.estimates is not None:
            self._agvm_update(gradients.estimates)
        with self.agvm.modulated_lr():
            self._optimizer_step()

    def _skip_step(self) -> None:
        """Leave the weights, the optimizer's state and AGVM's ``mu`` as they are: the
        gradient is not finite."""
        if self.grad_scaler is not None:  # its step skips the update and lowers the scale
            self._optimizer_step()
            return
        logger.warning(
            "Iteration %d: the gradient's norm is %s (losses %s): optimizer step skipped",
            self.iter,
            self.last_grad_norm,
            self.last_losses,
        )

    def _optimizer_step(self) -> None:
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()

    # --- AGVM: its two gradient estimates (largedet.optim.agvm) and their record -------

    def _micro_batch_halves(self, first_half: List[Optional[Tensor]]) -> List[Estimate]:
        return micro_batch_halves(self.agvm.params, first_half, comm.get_world_size())

    def _rank_halves(self) -> List[Estimate]:
        return rank_halves(self.agvm.params, comm.get_rank(), comm.get_world_size())

    def _agvm_update(self, estimates: List[Estimate]) -> None:
        """AGVM's update of mu from the step's estimates (completed and unscaled:
        :func:`~largedet.optim.agvm.complete_estimates`); ``agvm/phi/<part>`` and
        ``agvm/mu/<part>`` in the event storage."""
        scale = self.grad_scaler.get_scale() if self.grad_scaler is not None else 1.0
        phi = self.agvm.update(complete_estimates(estimates, scale))
        if comm.is_main_process():
            storage = get_event_storage()
            for part in self.agvm.parts:
                if part in phi:
                    storage.put_scalar(f"agvm/phi/{part}", phi[part], smoothing_hint=False)
                storage.put_scalar(f"agvm/mu/{part}", self.agvm.mu[part], smoothing_hint=False)

    def _write_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        iter: Optional[int] = None,
        *,
        grad_norm: Optional[Tensor] = None,
    ) -> None:
        """Record the step's losses, averaged over ranks, on every rank (:attr:`last_losses`)
        and in the event storage of the main process; data_time is the slowest rank's.
        ``grad_norm`` (a 0-d tensor) is read back in the same host sync as the losses, and
        its largest value over ranks becomes :attr:`last_grad_norm`.

        Unlike Detectron2's ``SimpleTrainer.write_metrics`` this does not raise on a
        non-finite loss: largedet's ``DivergenceGuard`` hook decides, on all ranks alike.
        """
        names = list(loss_dict)
        tensors = [loss_dict[n].float() for n in names]
        if grad_norm is not None:
            tensors.append(grad_norm.float())
        values = (
            torch.stack([t.to(tensors[0].device) for t in tensors]).tolist() if tensors else []
        )
        gathered: List[StepSync] = comm.all_gather(StepSync(values, data_time, self._stop_signal))
        self.stop_signals = [sync.stop_request for sync in gathered]
        self.stop_agreed = any(self.stop_signals)
        mean = np.mean([sync.metrics[: len(names)] for sync in gathered], axis=0) if names else []
        self.last_losses = {n: float(v) for n, v in zip(names, mean)}
        self.last_total_loss = float(sum(self.last_losses.values()))
        if grad_norm is not None:
            self.last_grad_norm = float(np.max([sync.metrics[-1] for sync in gathered]))
        if comm.is_main_process():
            iter = self.iter if iter is None else iter
            storage = get_event_storage()
            storage.put_scalar("rank_data_time", data_time, cur_iter=iter)
            storage.put_scalar("data_time", max(sync.data_time for sync in gathered), cur_iter=iter)
            storage.put_scalar(f"{prefix}total_loss", self.last_total_loss, cur_iter=iter)
            if grad_norm is not None:
                storage.put_scalar("grad_norm", self.last_grad_norm, cur_iter=iter)
            if len(self.last_losses) > 1:
                storage.put_scalars(cur_iter=iter, **self.last_losses)

    def state_dict(self):
        ret = super().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        if self.agvm is not None:
            ret["agvm"] = self.agvm.state_dict()
        return ret

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
        if self.agvm is not None:
            if "agvm" in state_dict:
                self.agvm.load_state_dict(state_dict["agvm"])
            else:
                logger.warning("The checkpoint has no AGVM state: every part's mu starts at 1")


def total_norm(tensors: List[Tensor]) -> Tensor:
    """The L2 norm of ``tensors`` taken together, a float32 0-d tensor on the first one's
    device (0 when there are none), without a host sync: one fused ``torch._foreach_norm``
    per (device, dtype), accumulated in float32 at least (finite float16 values do not
    overflow), then the norm of those norms. NaN or inf when any value is not finite."""
    if not tensors:
        return torch.zeros(())
    device = tensors[0].device
    groups: Dict[Tuple[torch.device, torch.dtype], List[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    norms = [
        n.to(device, torch.float32)
        for (_, dtype), ts in groups.items()
        for n in torch._foreach_norm(ts, 2.0, dtype=torch.promote_types(dtype, torch.float32))
    ]
    return torch.linalg.vector_norm(torch.stack(norms))


def _clip(grads: List[Tensor], norm: Tensor, max_norm: float) -> None:
    """Scale ``grads`` (whose global L2 norm is ``norm``) by ``min(1, max_norm / norm)``,
    on the device: no host sync."""
    coefficient = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coefficient.to(grads[0].device))


def clip_each_parameter(grads: List[Tensor], clip: ParameterClip) -> None:
    """Detectron2's per-parameter clipping on the device, without a host sync: each element
    clamped to ``[-value, value]`` ("value"), or each tensor scaled by
    ``min(1, value / (its norm_type-norm + 1e-6))`` ("norm", as ``clip_grad_norm_`` of one
    tensor)."""
    if clip.kind == "value":
        torch._foreach_clamp_min_(grads, -clip.value)
        torch._foreach_clamp_max_(grads, clip.value)
        return
    coefficients = torch._foreach_add(torch._foreach_norm(grads, clip.norm_type), 1e-6)
    torch._foreach_reciprocal_(coefficients)
    torch._foreach_mul_(coefficients, clip.value)
    torch._foreach_clamp_max_(coefficients, 1.0)
    torch._foreach_mul_(grads, coefficients)


def _copy(grad: Optional[Tensor]) -> Optional[Tensor]:
    return None if grad is None else grad.detach().clone()
