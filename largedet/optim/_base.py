"""Machinery shared by largedet's layer-wise adaptive optimizers (PMD-LAMB, LAMB, LARS).

What is shared is the torch.optim contract, not the math:

* state precision: moments live in ``promote(param dtype, float32)`` (float32 for
  fp16/bf16 parameters, float64 for float64 ones), also after ``load_state_dict``,
  which in plain torch.optim would cast them down to the parameter's dtype;
* checkpoints written before a hyperparameter existed load: ``__setstate__`` fills
  missing group keys from the optimizer's defaults;
* hyperparameters are validated per parameter group, naming the argument;
* the multi-tensor path groups tensors by (device, dtype), on the CPU in cache-sized
  buckets, and computes per-tensor trust ratios on the device, with zero norms
  guarded by ``torch.where`` (no host synchronisation);
* on the CPU, element-wise chains run on cache-sized flat pieces (``cpu_pieces``) into
  reusable ``Scratch`` buffers, so that a step allocates no model-sized temporaries.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from ._compiled import CompiledState, compiled_step_available

__all__ = [
    "LayerwiseOptimizer",
    "Scratch",
    "state_dtype",
    "foreach_buckets",
    "cpu_pieces",
    "layerwise_trust",
    "upcast",
    "compiled_min_numel",
    "COMPILED_STEP_MODES",
]

LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)

#: parameter-group keys that choose a code path, not a hyperparameter
SWITCHES = ("foreach", "fused")


def state_dtype(param: Tensor) -> torch.dtype:
    """dtype of the optimizer state for ``param``: float32 or better."""
    return torch.promote_types(param.dtype, torch.float32)


#: On the CPU, a foreach bucket holds at most this many elements (256 KiB per float32
#: tensor list). Each foreach op then reads data still in cache from the previous op,
#: and its temporaries are small blocks the allocator reuses, instead of fresh
#: model-sized buffers page-faulted in at every step (measured: a whole-model bucket
#: made PMD-LAMB's CPU step about 1.5x slower). On accelerators a bucket is a whole
#: (device, dtype) group: fewer, larger kernel launches.
CPU_BUCKET_NUMEL = 1 << 16


#: On the CPU, the element-wise ops of a step run on pieces of at most this many elements
#: (1 MiB per float32 operand): a tensor larger than that is cut into flat chunks, so
#: that every op of the chain finds its operands still in cache from the op before it
#: (about 6 MiB for PMD-LAMB's six operands) instead of streaming a 9 MiB tensor from
#: memory once per op.
CPU_CHUNK_NUMEL = 1 << 18


def foreach_buckets(tensors: Sequence[Tensor]) -> List[Tuple[torch.dtype, List[int]]]:
    """Indices of ``tensors`` in buckets for ``torch._foreach_*`` calls, with their dtype.

    Tensors are grouped by (device, dtype) in first-seen order; on the CPU each group is
    split into consecutive runs of at most ``CPU_BUCKET_NUMEL`` elements (a larger tensor
    is a run of its own).
    """
    groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        groups[(t.device, t.dtype)].append(i)
    buckets: List[Tuple[torch.dtype, List[int]]] = []
    for (device, dtype), indices in groups.items():
        if device.type != "cpu":
            buckets.append((dtype, indices))
            continue
        buckets.append((dtype, []))  # each group starts a bucket of its own
        size = 0
        for i in indices:
            n = tensors[i].numel()
            if buckets[-1][1] and size + n > CPU_BUCKET_NUMEL:
                buckets.append((dtype, []))
                size = 0
            buckets[-1][1].append(i)
            size += n
    return buckets


def cpu_pieces(
    lists: Sequence[Sequence[Tensor]], limit: Optional[int] = None
) -> List[Tuple[List[int], List[List[Tensor]]]]:
    """Flat pieces of parallel tensor lists, grouped for ``torch._foreach_*`` calls.

    ``lists`` are lists of contiguous tensors of equal shapes position by position (a
    parameter, its gradient, its moments, ...). Each tensor is flattened; one larger than
    ``limit`` (default ``CPU_CHUNK_NUMEL``) is cut into consecutive chunks of ``limit``
    elements. Consecutive pieces are grouped so that a group holds at most ``limit``
    elements. Returns, per group, the position in ``lists`` of each piece's tensor and
    one list of pieces per input list. Element-wise ops on the pieces compute exactly
    what they compute on the whole tensors.
    """
    limit = CPU_CHUNK_NUMEL if limit is None else limit
    groups: List[Tuple[List[int], List[List[Tensor]]]] = []
    size = limit
    for position, column in enumerate(zip(*lists)):
        n = column[0].numel()
        flats = [t.view(-1) for t in column]
        for start in range(0, n, limit):
            length = min(limit, n - start)
            if size + length > limit:
                groups.append(([], [[] for _ in lists]))
                size = 0
            groups[-1][0].append(position)
            for pieces, flat in zip(groups[-1][1], flats):
                pieces.append(flat[start : start + length] if length < n else flat)
            size += length
    return groups


class Scratch:
    """Reusable flat scratch buffers of an optimizer, per (name, device, dtype).

    Not optimizer state: never saved, grown on demand, so that a CPU step allocates no
    model-sized temporaries (each would be page-faulted in afresh at every step).
    """

    def __init__(self) -> None:
        self._buffers: Dict[Tuple[str, torch.device, torch.dtype], Tensor] = {}

    def flat(self, name: str, numel: int, like: Tensor) -> Tensor:
        """A flat buffer of ``numel`` elements, ``like``'s device and dtype, contents undefined."""
        key = (name, like.device, like.dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, device=like.device, dtype=like.dtype)
            self._buffers[key] = buf
        return buf[:numel]

    def like(self, name: str, tensors: Sequence[Tensor]) -> List[Tensor]:
        """Views of one buffer shaped like ``tensors``, one after another."""
        flat = self.flat(name, sum(t.numel() for t in tensors), tensors[0])
        views, offset = [], 0
        for t in tensors:
            views.append(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()
        return views


def layerwise_trust(
    w_norms: Sequence[Tensor],
    u_norms: Sequence[Tensor],
    *,
    eta: float = 1.0,
    weight_decay: float = 0.0,
    max_value: Optional[float] = None,
) -> Tensor:
    """Per-tensor trust ratios, as a 1-D tensor on the norms' device.

    ``trust_i = eta * ||w_i|| / (||u_i|| + weight_decay * ||w_i||)`` where ``||w_i|| > 0``
    and ``||u_i|| > 0``, else 1; then ``min(trust_i, max_value)`` when ``max_value`` is
    given. ``w_norms`` and ``u_norms`` are lists of 0-dim tensors (``torch._foreach_norm``
    output). The zero-norm guard is a ``torch.where``: no host synchronisation.
    """
    wn = torch.stack(list(w_norms))
    un = torch.stack(list(u_norms))
    num = wn * eta if eta != 1.0 else wn
    den = un + weight_decay * wn if weight_decay != 0.0 else un
    trust = torch.where((wn > 0) & (un > 0), num / den, torch.ones_like(wn))
    if max_value is not None:
        trust = trust.clamp(max=max_value)
    return trust


def upcast(tensors: List[Tensor]) -> List[Tensor]:
    """float32 copies of fp16/bf16 tensors; other tensors are returned as they are."""
    return [t.float() if t.dtype in LOW_PRECISION_DTYPES else t for t in tensors]


#: ``SOLVER.COMPILED_STEP`` value -> the optimizers' ``fused`` argument
COMPILED_STEP_MODES: Dict[str, Optional[bool]] = {"auto": None, "always": True, "never": False}

#: With ``fused=None`` on the CPU, tensors of at least this many elements take the compiled
#: step and smaller ones the eager multi-tensor step. ``python benchmarks/compiled_step_sizes.py``
#: on a 2-core Xeon, quiet, 2026-11-26: on 40 tensors of 32,768 elements the compiled step
#: takes 0.80x the eager one's time, of 131,072 0.67x, of 8,192 1.33x (about 0.1 ms of call
#: overhead per tensor).
COMPILED_MIN_NUMEL = 1 << 15


def compiled_min_numel(
    fused: Optional[bool], foreach: Optional[bool], params: Sequence[Tensor]
) -> Optional[int]:
    """The smallest tensor a group's step hands to the compiled path, or None for none.

    ``fused=True``: every tensor (0); ``False``: none. ``None`` (the default): on the CPU,
    tensors of at least ``COMPILED_MIN_NUMEL`` elements, where the compiled step was
    measured faster than the eager one, unless ``foreach=False`` asks for the per-tensor
    reference path; on other devices none until it is measured there.
    """
    if fused is False or not params:
        return None
    if fused:
        return 0
    if foreach is False or params[0].device.type != "cpu":
        return None
    if max(p.numel() for p in params) < COMPILED_MIN_NUMEL:
        return None
    return COMPILED_MIN_NUMEL if compiled_step_available() else None


class LayerwiseOptimizer(Optimizer):
    """Base class: a torch.optim.Optimizer with per-group validation, old-checkpoint
    defaults and float32-or-better state.

    Subclasses set ``_class_defaults`` (the hyperparameters a checkpoint may lack, with
    the values to assume) and implement ``_validate_group(group)``. What the training loop
    and the solver read of an optimizer (:mod:`largedet.optim.protocol`): the per-group key
    ``adapt``, :meth:`compiled_tensors`, and ``uses_clock`` False unless a subclass sets it.
    """

    #: hyperparameter -> value assumed when neither the checkpoint nor ``defaults`` has it
    _class_defaults: Dict[str, Any] = {}
    #: the per-group keys read besides ``lr`` and ``weight_decay`` (:mod:`largedet.optim.protocol`)
    group_keys: Tuple[str, ...] = ("adapt",)
    #: whether the training loop sets the step's clock (:mod:`largedet.optim.protocol`)
    uses_clock: bool = False

    def __init__(self, params: Iterable, defaults: Dict[str, Any]) -> None:
        self._validate_group(defaults)
        super().__init__(params, defaults)

    @staticmethod
    def hyperparameters(arguments: Dict[str, Any]) -> Dict[str, Any]:
        """A subclass constructor's hyperparameters, the group defaults, from its
        ``locals()``: every argument but ``self`` and ``params``."""
        return {k: v for k, v in arguments.items() if k not in ("self", "params", "__class__")}

    def _validate_group(self, group: Dict[str, Any]) -> None:
        raise NotImplementedError

    def _prepare(self, group: Dict[str, Any]) -> Any:
        """The group's tensors that have gradients (``.params`` and the rest the update
        functions read), with missing state created and the step counted."""
        raise NotImplementedError

    def _update_paths(self) -> Dict[str, Callable[..., None]]:
        """The update functions: ``compiled``, ``per_tensor`` and ``multi_tensor``."""
        raise NotImplementedError

    def _step_args(self, group: Dict[str, Any]) -> Dict[str, Any]:
        """The group's hyperparameters as the update functions take them."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Per group: the compiled update (with the smallest tensor it takes and the eager
        path of the others) where :func:`compiled_min_numel` says so, else the per-tensor
        one for ``foreach=False``, else the multi-tensor one."""
        loss = self._run_closure(closure)
        paths = self._update_paths()
        for group in self.param_groups:
            inputs = self._prepare(group)
            if not inputs.params:
                continue
            min_numel = None
            if self.compiled_state.disabled_reason is None:
                min_numel = compiled_min_numel(group["fused"], group["foreach"], inputs.params)
            if min_numel is not None:
                update = functools.partial(
                    paths["compiled"], min_numel=min_numel, foreach=group["foreach"] is not False
                )
            else:
                update = paths["per_tensor" if group["foreach"] is False else "multi_tensor"]
            update(inputs, **self._step_args(group))
        return loss

    def compiled_tensors(self, group: Dict[str, Any]) -> int:
        """How many tensors of the param group ``group`` the compiled step updates, as
        :func:`compiled_min_numel` chooses them (:mod:`largedet.optim.protocol`)."""
        params = group["params"]
        least = compiled_min_numel(group["fused"], group.get("foreach"), params)
        return 0 if least is None else sum(p.numel() >= least for p in params)

    @staticmethod
    def _validate_switches(group: Dict[str, Any]) -> None:
        for name in SWITCHES:
            value = group.get(name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"Invalid {name}: {value!r} (True, False or None)")

    @property
    def scratch(self) -> Scratch:
        """This optimizer's scratch buffers (created on first use, also after unpickling)."""
        if getattr(self, "_scratch", None) is None:
            self._scratch = Scratch()
        return self._scratch

    @property
    def compiled_state(self) -> CompiledState:
        """Whether this optimizer's compiled step still runs: a failed compilation turns it off
        for this optimizer only, with the reason (``compiled_state.disabled_reason``)."""
        if getattr(self, "_compiled_state", None) is None:
            self._compiled_state = CompiledState()
        return self._compiled_state

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        merged = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self._validate_group(merged)
        super().add_param_group(param_group)
        if any(p.is_complex() for p in self.param_groups[-1]["params"]):
            self.param_groups.pop()
            raise ValueError(f"{type(self).__name__} does not support complex parameters")

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for key, value in self._class_defaults.items():
            self.defaults.setdefault(key, value)
        for group in self.param_groups:
            for key in self._class_defaults:
                group.setdefault(key, self.defaults[key])

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As torch.optim's, but floating-point state keeps ``state_dtype(param)``.

        torch.optim casts every floating state tensor to the parameter's dtype, which
        would round fp32 moments of bf16/fp16 parameters to 16 bits. The code-path switches
        (``foreach``, ``fused``) stay this optimizer's: they say how this process computes
        a step, not what the checkpoint holds, so a checkpoint written by the compiled step
        resumes on the eager one where that was asked for, and the other way round.
        """
        switches = [{k: g[k] for k in SWITCHES if k in g} for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, own in zip(self.param_groups, switches):
            group.update(own)
        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(saved_ids, params):
            saved = state_dict["state"].get(pid)
            if saved is None:
                continue
            for key, value in saved.items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=state_dtype(p))

    @staticmethod
    def _check_grad(optimizer_name: str, grad: Tensor) -> None:
        if grad.is_sparse:
            raise RuntimeError(f"{optimizer_name} does not support sparse gradients")

    def _run_closure(self, closure: Optional[Callable[[], Any]]) -> Any:
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
