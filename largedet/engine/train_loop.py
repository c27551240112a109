"""One optimizer step over K accumulated micro-batches, in full or mixed precision."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Dict, Mapping, Optional

import numpy as np
import torch
from detectron2.engine import SimpleTrainer
from detectron2.utils import comm
from detectron2.utils.events import get_event_storage
from torch.nn.parallel import DistributedDataParallel

__all__ = ["AccumulationTrainer"]

logger = logging.getLogger(__name__)


class AccumulationTrainer(SimpleTrainer):
    """Detectron2's ``SimpleTrainer`` (and ``AMPTrainer``) with gradient accumulation.

    Each :meth:`run_step` is one optimizer step. It draws ``accumulation_steps`` (K)
    batches from the data loader, and for each runs the forward pass and the backward
    pass of ``loss / K``, so that the summed gradient is the mean over the K
    micro-batches: with losses that are means over images, exactly the gradient of one
    batch K times larger. Under DDP the first K - 1 backward passes run in
    ``model.no_sync()``, so gradients are all-reduced once per step. Then the hooks'
    ``after_backward``, one metrics record (each loss averaged over the micro-batches and
    the ranks) and one optimizer step.

    Mixed precision: ``amp_dtype`` ``torch.float16`` runs the forward passes under
    autocast and scales the loss with ``grad_scaler`` (created when not given), which
    unscales the summed gradients once per step, before the optimizer (and its gradient
    clipping) sees them; ``torch.bfloat16`` needs no scaler. ``amp_dtype`` None is full
    precision.

    After each step, :attr:`last_losses` holds the step's losses (floats averaged over
    micro-batches and ranks, identical on every rank) and :attr:`last_total_loss` their sum.
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
        self.last_losses: Dict[str, float] = {}
        self.last_total_loss = float("nan")

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.amp_dtype)

    def _sync_context(self, last: bool):
        if last or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def run_step(self) -> None:
        assert self.model.training, "[AccumulationTrainer] model was changed to eval mode!"
        k = self.accumulation_steps
        data_time = 0.0
        step_losses: Dict[str, torch.Tensor] = {}
        for i in range(k):
            start = time.perf_counter()
            data = next(self._data_loader_iter)
            data_time += time.perf_counter() - start
            with self._sync_context(last=i == k - 1):
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

        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
            get_event_storage().put_scalar(
                "grad_scaler", self.grad_scaler.get_scale(), smoothing_hint=False
            )
        self.after_backward()
        self._write_metrics(step_losses, data_time)
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()

    def _write_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        iter: Optional[int] = None,
    ) -> None:
        """Record the step's losses, averaged over ranks, on every rank (:attr:`last_losses`)
        and in the event storage of the main process; data_time is the slowest rank's.

        Unlike Detectron2's ``SimpleTrainer.write_metrics`` this does not raise on a
        non-finite loss: largedet's ``DivergenceGuard`` hook decides, on all ranks alike.
        """
        names = list(loss_dict)
        values = torch.stack([loss_dict[n] for n in names]).tolist() if names else []
        gathered = comm.all_gather((values, data_time))
        mean = np.mean([v for v, _ in gathered], axis=0) if names else []
        self.last_losses = {n: float(v) for n, v in zip(names, mean)}
        self.last_total_loss = float(sum(self.last_losses.values()))
        if comm.is_main_process():
            iter = self.iter if iter is None else iter
            storage = get_event_storage()
            storage.put_scalar("rank_data_time", data_time, cur_iter=iter)
            storage.put_scalar("data_time", max(t for _, t in gathered), cur_iter=iter)
            storage.put_scalar(f"{prefix}total_loss", self.last_total_loss, cur_iter=iter)
            if len(self.last_losses) > 1:
                storage.put_scalars(cur_iter=iter, **self.last_losses)

    def state_dict(self):
        ret = super().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
