#!/usr/bin/env python3
"""The cost of TSM's temporal shift: TSM's training step time over TSN's, per implementation.

    python projects/video/benchmarks/shift_cost.py --device cuda     # ResNet-50, 8 x 8 x 224^2
    python projects/video/benchmarks/shift_cost.py --device cuda --amp none bf16
    python projects/video/benchmarks/shift_cost.py --device cpu --depth 10 --width 8 \\
        --size 32 --batch 2 --steps 1 --rounds 2                     # CPU dry run

TSN and TSM are the project's models (``build_model``, ``TSNResNet`` / ``TSMResNet``, the
same weights), TSM once per shift implementation (``MODEL.VIDEO.TSM.SHIFT_IMPL``, the keys
of ``SHIFT_IMPLS``, or ``--impls``). A training step is forward, backward and an SGD step
on a batch of random uint8 clips already on the device (no data loading), optionally
under autocast (``--amp bf16``; ``--amp none bf16`` measures both). Models (and AMP modes)
are timed in interleaved rounds of ``--steps`` steps each, in a fresh random order every
round, after ``--warmup`` untimed steps each (``warmup_s``). A model's step time is its
median over rounds; an implementation's TSM / TSN ratio is the median over rounds of the
ratio within each round (both timed seconds apart), with its range. The goal: TSM <= 1.03 x
TSN.

Before the rounds, each implementation's shift is checked against ``"slices"`` on the
device, forward and backward, bit for bit, on the input of every shifted block (shapes
taken from one forward of the network), and the shift alone (forward and backward over
all shifted blocks, ``shift_ms``) is timed: the least a step can lose to the shift.
Triton's and Inductor's compilation of the shift happen there (``check_s``).

``--compile-model`` adds TSN and TSM (``"slices"``) with their backbones compiled by
``torch.compile``, compiled after the eager rounds if at least ``--compile-min-seconds``
are left; compilation time is reported apart (``compile_s``) and the compiled pair is then
timed in rounds of its own (keys prefixed ``compiled``).

``--max-seconds`` is a hard limit, counted from the end of the imports: no round starts
that would end past it, and an alarm stops a step that runs over; what was measured is
printed either way (complete rounds only).

The last line is ``GPU-CHECK-FIGURES {json}`` with the keys: ``device``, ``torch``,
``config`` (depth, width, batch, frames, size, amp, channels_last), ``tf32`` (torch's
TF32 switches for cuDNN and matmuls, left as they are), ``exact`` (``"<amp>/<impl>"`` ->
equal to ``"slices"`` forward and backward), ``shift_ms`` (``"<amp>/<impl>"`` -> ms of the
shift alone per step), ``step_ms`` (``"<amp>/<model>"`` -> median ms per step),
``step_ms_range`` (-> [min, max]), ``ratio`` (``"<amp>/<impl>"`` -> median TSM / TSN step
time), ``ratio_range`` (-> [min, max]), ``meets_goal`` (-> ratio <= 1.03), ``rounds``
(complete rounds per AMP mode), ``warmup_s`` (model -> s), ``compile_s`` (model -> s, with
``--compile-model``), ``setup_s`` (building the models), ``check_s``, ``elapsed_s``,
``stopped_by_time`` (bool), ``errors`` (model -> the error that dropped it: an
implementation that fails on the machine is reported there and the others measured).
"""

import argparse
import json
import random
import signal
import statistics
import time

import largedet_video  # noqa: F401  (imports largedet first)
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage

from largedet_video import add_video_config
from largedet_video.modeling import temporal_shift
from largedet_video.modeling.temporal_shift import SHIFT_IMPLS
from step_timing import ALARM, AMP_DTYPES, start_run, sync

GOAL = 1.03


def build(args, backbone, shift_impl="slices"):
    cfg = add_video_config(get_cfg())
    cfg.MODEL.DEVICE = args.device
    cfg.MODEL.VIDEO.BACKBONE = backbone
    cfg.MODEL.VIDEO.RESNET.DEPTH = args.depth
    cfg.MODEL.VIDEO.RESNET.WIDTH = args.width
    cfg.MODEL.VIDEO.TSM.SHIFT_IMPL = shift_impl
    cfg.MODEL.VIDEO.NUM_CLASSES = 400
    torch.manual_seed(0)
    model = build_model(cfg).train()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


class Runner:
    """One model, its optimizer, and how to run ``steps`` training steps."""

    def __init__(self, model, args):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        self.args = args

    def steps(self, batch, steps, amp):
        dtype = AMP_DTYPES[amp]
        device_type = "cuda" if self.args.device.startswith("cuda") else "cpu"
        sync(self.args.device)
        start = time.perf_counter()
        for _ in range(steps):
            autocast = torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)
            with autocast:
                loss = self.model(batch)["loss_cls"]
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        sync(self.args.device)
        return (time.perf_counter() - start) / steps


def shifted_inputs(model, batch):
    """(input shape, num_segments, fold_div) of every shifted block, from one forward."""
    found = []

    def record(block, inputs):
        x, num_segments = inputs
        found.append((tuple(x.shape), num_segments, block.shift_div))

    blocks = [b for stage in model.backbone.stages for b in stage if b.shift_div > 0]
    handles = [b.register_forward_pre_hook(record) for b in blocks]
    with torch.no_grad():
        model.logits(model.preprocess(batch["clip"]))
    for h in handles:
        h.remove()
    return found


def check_and_time_shifts(args, shapes, impls, dtype):
    """({impl: equal to "slices" forward and backward}, {impl: ms of the shift alone,
    forward and backward over ``shapes``, median of ``--shift-reps``})."""
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    gen = torch.Generator(device=args.device).manual_seed(0)
    inputs = []
    for shape, t, div in shapes:
        x = torch.randn(shape, generator=gen, device=args.device).to(dtype, memory_format=fmt)
        inputs.append((x.requires_grad_(True), torch.randn_like(x), t, div))

    def run(impl):
        grads = []
        for x, g, t, div in inputs:
            out = temporal_shift(x, t, div, impl)
            grads.append((out.detach(), torch.autograd.grad(out, x, g)[0]))
        return grads

    reference = run("slices")
    exact = {}
    for impl in impls:
        got = run(impl)
        exact[impl] = all(
            torch.equal(a, c) and torch.equal(b, d) and a.stride() == c.stride()
            for (a, b), (c, d) in zip(got, reference)
        )
    del reference, got
    times = {impl: [] for impl in impls}
    for _ in range(args.shift_reps):
        for impl in random.sample(impls, len(impls)):
            sync(args.device)
            start = time.perf_counter()
            run(impl)
            sync(args.device)
            times[impl].append(1000 * (time.perf_counter() - start))
    return exact, {impl: statistics.median(v) for impl, v in times.items()}


def run_rounds(runners, batch, args, deadline, step_ms, rounds_done, amps, prefix=""):
    """Interleaved rounds over ``runners`` x ``amps`` until ``--rounds`` or the deadline;
    appends each complete round's ms per step to ``step_ms["<amp>/<name>"]``."""
    configs = [(amp, name) for amp in amps for name in runners]
    last = 0.0
    for _ in range(args.rounds):
        if time.perf_counter() + 1.2 * last > deadline:
            break
        start = time.perf_counter()
        measured = {}
        for amp, name in random.sample(configs, len(configs)):
            measured[f"{amp}/{prefix}{name}"] = 1000 * runners[name].steps(batch, args.steps, amp)
        for key, ms in measured.items():
            step_ms.setdefault(key, []).append(ms)
        for amp in amps:
            rounds_done[f"{prefix}{amp}"] = rounds_done.get(f"{prefix}{amp}", 0) + 1
        last = time.perf_counter() - start


def summarize(step_ms, amps, impls, prefix=""):
    """TSM / TSN ratios per round, for each AMP mode and implementation."""
    ratio, ratio_range = {}, {}
    for amp in amps:
        tsn = step_ms.get(f"{amp}/{prefix}TSN", [])
        for impl in impls:
            tsm = step_ms.get(f"{amp}/{prefix}TSM {impl}", [])
            per_round = [a / b for a, b in zip(tsm, tsn)]
            if per_round:
                key = f"{amp}/{prefix}{impl}"
                ratio[key] = statistics.median(per_round)
                ratio_range[key] = [min(per_round), max(per_round)]
    return ratio, ratio_range


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--depth", type=int, default=50)
    add("--width", type=int, default=64, help="ResNet width (64: the real one)")
    add("--batch", type=int, default=8, help="clips per step")
    add("--frames", type=int, default=8)
    add("--size", type=int, default=224, help="frame side in pixels")
    add("--impls", nargs="+", choices=sorted(SHIFT_IMPLS), default=list(SHIFT_IMPLS))
    add("--amp", nargs="+", choices=sorted(AMP_DTYPES), default=["none"])
    add("--channels-last", action="store_true", help="models in channels-last")
    add("--steps", type=int, default=10, help="timed steps per model and round")
    add("--rounds", type=int, default=30, help="at most this many rounds")
    add("--warmup", type=int, default=3, help="untimed steps per model and AMP mode")
    add("--shift-reps", type=int, default=10, help="repetitions of the shift alone")
    add("--compile-model", action="store_true")
    add("--compile-min-seconds", type=float, default=60.0)
    add("--max-seconds", type=float, default=80.0)
    add("--threads", type=int, default=1, help="torch threads on the CPU")
    return parser.parse_args()


def dropped(error, name, runners, figures):
    """Record ``error`` of model ``name`` (a failing shift implementation: Triton or
    Inductor missing on the machine, say) in ``figures["errors"]`` and drop the model,
    so that the others are still measured; the alarm's exception is re-raised."""
    if ALARM["rang"] or name == "TSN":
        raise error
    figures["errors"][name] = f"{type(error).__name__}: {error}"[:500]
    runners.pop(name, None)
    print(f"  {name} dropped: {figures['errors'][name]}", flush=True)


def measure(args, deadline, figures, step_ms, rounds_done):
    """Build, check, warm up and time the models (see the module docstring), filling
    ``figures``, ``step_ms`` and ``rounds_done`` as it goes."""
    t0 = time.perf_counter()
    size = (args.batch, args.frames, 3, args.size, args.size)
    batch = {
        "clip": torch.randint(0, 256, size, dtype=torch.uint8).to(args.device),
        "label": torch.randint(0, 400, (args.batch,)).to(args.device),
    }
    runners = {"TSN": Runner(build(args, "TSNResNet"), args)}
    for impl in args.impls:
        runners[f"TSM {impl}"] = Runner(build(args, "TSMResNet", impl), args)
    figures["setup_s"] = time.perf_counter() - t0

    start = time.perf_counter()
    shapes = shifted_inputs(runners[f"TSM {args.impls[0]}"].model, batch)
    impls = list(args.impls)
    for amp in args.amp:
        dtype = AMP_DTYPES[amp] or torch.float32
        for impl in list(impls):
            try:
                check_and_time_shifts(args, shapes, [impl], dtype)
            except Exception as e:
                dropped(e, f"TSM {impl}", runners, figures)
                impls.remove(impl)
        exact, shift_ms = check_and_time_shifts(args, shapes, impls, dtype)
        figures["exact"].update({f"{amp}/{k}": v for k, v in exact.items()})
        figures["shift_ms"].update({f"{amp}/{k}": v for k, v in shift_ms.items()})
        print(
            f"  shift alone ({amp}), fwd+bwd over {len(shapes)} blocks:"
            + "".join(f"  {k} {v:.2f} ms" + ("" if exact[k] else " (NOT EXACT)")
                      for k, v in shift_ms.items()),
            flush=True,
        )  # fmt: skip
    figures["check_s"] = time.perf_counter() - start

    with EventStorage():
        for name, runner in list(runners.items()):
            start = time.perf_counter()
            try:
                for amp in args.amp if args.warmup else []:
                    runner.steps(batch, args.warmup, amp)
            except Exception as e:
                dropped(e, name, runners, figures)
                continue
            figures["warmup_s"][name] = time.perf_counter() - start
        print("  warm-up s: " + ", ".join(f"{k} {v:.1f}" for k, v in figures["warmup_s"].items()))
        run_rounds(runners, batch, args, deadline, step_ms, rounds_done, args.amp)

        if not args.compile_model or deadline - time.perf_counter() < args.compile_min_seconds:
            return
        del runners
        compiled = {}
        for name, backbone in (("TSN", "TSNResNet"), ("TSM slices", "TSMResNet")):
            model = build(args, backbone)
            model.backbone = torch.compile(model.backbone)
            compiled[name] = Runner(model, args)
            start = time.perf_counter()
            for amp in args.amp:
                compiled[name].steps(batch, max(args.warmup, 1), amp)
            figures["compile_s"][name] = time.perf_counter() - start
            print(f"  compiled {name}: {figures['compile_s'][name]:.1f} s to compile and warm up")
        run_rounds(compiled, batch, args, deadline, step_ms, rounds_done, args.amp, "compiled ")


def main():
    args = parse_args()
    t0, deadline, name = start_run(args)
    print(
        f"Device: {name}; torch {torch.__version__}; ResNet-{args.depth} (width {args.width}), "
        f"{args.batch} clips x {args.frames} frames x {args.size}^2, AMP {args.amp}, "
        f"{'channels-last' if args.channels_last else 'contiguous'}; {args.steps} steps per round",
        flush=True,
    )
    figures = {
        "device": name,
        "torch": torch.__version__,
        "config": {
            k: getattr(args, k)
            for k in ("depth", "width", "batch", "frames", "size", "amp", "channels_last")
        },
        "tf32": {
            "cudnn": torch.backends.cudnn.allow_tf32,
            "matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "exact": {},
        "shift_ms": {},
        "warmup_s": {},
        "compile_s": {},
        "errors": {},
    }
    step_ms, rounds_done = {}, {}
    stopped = False
    try:
        measure(args, deadline, figures, step_ms, rounds_done)
    except Exception:
        if not ALARM["rang"]:
            raise
        stopped = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    stopped = stopped or not rounds_done or any(n < args.rounds for n in rounds_done.values())

    # Only complete rounds count: a round cut by the alarm was never appended.
    ratio, ratio_range = summarize(step_ms, args.amp, args.impls)
    c_ratio, c_range = summarize(step_ms, args.amp, ["slices"], "compiled ")
    ratio.update(c_ratio)
    ratio_range.update(c_range)
    for key, v in sorted(step_ms.items()):
        print(
            f"  {key:28s} {statistics.median(v):8.2f} ms/step  [{min(v):.2f}-{max(v):.2f}]"
            f"  n={len(v)}"
        )
    for key, r in ratio.items():
        lo, hi = ratio_range[key]
        verdict = "meets" if r <= GOAL else "misses"
        print(f"  TSM/TSN {key:22s} {r:.4f}  [{lo:.4f}-{hi:.4f}]  ({verdict} <= {GOAL})")
    figures.update(
        step_ms={k: statistics.median(v) for k, v in step_ms.items()},
        step_ms_range={k: [min(v), max(v)] for k, v in step_ms.items()},
        ratio=ratio,
        ratio_range=ratio_range,
        meets_goal={k: r <= GOAL for k, r in ratio.items()},
        rounds=rounds_done,
        elapsed_s=time.perf_counter() - t0,
        stopped_by_time=stopped,
    )
    print("GPU-CHECK-FIGURES " + json.dumps(figures, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
