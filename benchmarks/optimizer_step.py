"""Time one optimizer step on the trainable parameters of Faster R-CNN R50-FPN.

The model is Detectron2's ``COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml`` as
``build_model`` makes it (stem and res2 frozen: about 41M trainable parameters), on
the GPU when there is one, else the CPU; trailing ``KEY VALUE`` pairs override its
config (a smaller model for a dry run, say). Gradients are random; parameter groups come
from ``largedet.solver.get_optimizer_params`` as in training (biases: no weight
decay, and for LAMB / PMD-LAMB / LARS no trust ratio). All optimizers share the
parameters and gradients, each keeps its own state; repetitions are interleaved
(the order rotates every round) so that a noisy, shared machine affects all alike.
Prints, for each optimizer, the median wall-clock step time and its ratio to
``torch.optim.AdamW(foreach=True)``; the median over rounds of the ratio to AdamW's
step in the same round (paired, so slow drifts of the machine's load cancel); the
median process CPU time per step (all threads; time spent waiting for a core on a
shared machine is not counted) and its ratio to AdamW's; and the fastest step.
Where torch has a fused AdamW for the device (CUDA; recent torch on the CPU too), a
last line gives PMD-LAMB (multi-tensor) against it (the GPU target: <= 1.1x). timm's
``Lamb`` (defaults: global gradient-norm clipping at 1.0, trust ratio on groups with
weight decay) is timed too where timm is installed (it is not a largedet dependency).

With ``--processes N`` the measurement runs in N fresh processes, one after another, and
a last table gives each optimizer's ratio to AdamW(foreach=True) per process (median
and paired) with the spread over processes: an allocator or memory-layout effect that
differs between processes shows there, not within one. The minor page faults per step
(CPU) are printed too: a step that allocates model-sized temporaries faults them in
again at every step.

With ``--profile`` the timed rounds are followed by a profile (torch.profiler) of a few
steps of the multi-tensor PMD-LAMB, AdamW (foreach and fused) and SGD: per step, the
kernels launched, their summed device time against the step's wall-clock time (a step
whose kernels take a small part of its wall clock is bound by launching them, one whose
kernels fill it by memory traffic), the bytes the step must at least move (the
optimizer's tensors read and written once) and the top kernels by time.

    python benchmarks/optimizer_step.py [--rounds 15] [--processes 5] [--device cpu] [KEY VALUE ...]
    python benchmarks/optimizer_step.py --device cuda --profile --skip-compiled
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import torch

import largedet  # noqa: F401
from detectron2 import model_zoo
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from largedet import modeling  # noqa: F401  (largedet's backbones, for overrides)
from largedet.config import add_largedet_config
from largedet.config.safe_yaml import merge_config_file
from largedet.optim import LAMB, LARS, PMDLAMB
from largedet.solver import get_optimizer_params

logger = logging.getLogger("benchmarks.optimizer_step")

LR = 1e-6  # small, so that the shared weights stay in range over all rounds
WEIGHT_DECAY = 1e-4


PMD_LAMB = "PMD-LAMB (multi-tensor)"
PMD_LAMB_COMPILED = "PMD-LAMB (compiled)"
FUSED_ADAMW = "AdamW(fused=True)"
TIMM_LAMB = "timm Lamb"
#: the optimizers whose first step compiles (timed apart, as the compile time)
COMPILED = (PMD_LAMB_COMPILED, "LAMB (compiled)", "LARS (compiled)")


def build_params(device: str, opts: List[str]):
    cfg = add_largedet_config(get_cfg())
    merge_config_file(cfg, model_zoo.get_config_file("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"))
    cfg.merge_from_list(opts)
    cfg.MODEL.DEVICE = device
    cfg.SOLVER.BASE_LR = LR
    cfg.SOLVER.WEIGHT_DECAY = WEIGHT_DECAY
    model = build_model(cfg)
    gen = torch.Generator(device=device).manual_seed(0)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype) * 1e-3
    return cfg, model


def optimizers(
    cfg, model, device: str, compiled: bool = True
) -> Dict[str, torch.optim.Optimizer]:
    def adaptive():
        return get_optimizer_params(cfg, model, layer_adaptive=True)

    def plain():
        return get_optimizer_params(cfg, model)

    makers: Dict[str, Callable[[], torch.optim.Optimizer]] = {
        PMD_LAMB: lambda: PMDLAMB(
            adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=True, fused=False
        ),
        "PMD-LAMB (per-tensor)": lambda: PMDLAMB(
            adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=False
        ),
        PMD_LAMB_COMPILED: lambda: PMDLAMB(
            adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True
        ),
        "LAMB": lambda: LAMB(adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, fused=False),
        "LAMB (compiled)": lambda: LAMB(adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True),
        "LARS": lambda: LARS(adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, fused=False),
        "LARS (compiled)": lambda: LARS(adaptive(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True),
        "AdamW(foreach=True)": lambda: torch.optim.AdamW(
            plain(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=True
        ),
        "SGD(foreach=True, momentum=0.9)": lambda: torch.optim.SGD(
            plain(), lr=LR, momentum=0.9, weight_decay=WEIGHT_DECAY, foreach=True
        ),
    }
    if not compiled:
        for name in COMPILED:
            del makers[name]
    if fused_adamw_available(device):
        makers[FUSED_ADAMW] = lambda: torch.optim.AdamW(
            plain(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True
        )
    if importlib.util.find_spec("timm") is not None:
        from timm.optim import Lamb

        makers[TIMM_LAMB] = lambda: Lamb(plain(), lr=LR, weight_decay=WEIGHT_DECAY)
    return {name: make() for name, make in makers.items()}


def fused_adamw_available(device: str) -> bool:
    """Whether this torch has a fused AdamW kernel for ``device`` (CUDA; the CPU since 2.4)."""
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        return False
    return True


def timed_step(opt: torch.optim.Optimizer, device: str) -> Tuple[float, float, int]:
    """(wall-clock seconds, process CPU seconds, minor page faults) of one ``opt.step()``."""
    if device == "cuda":
        torch.cuda.synchronize()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


REF = "AdamW(foreach=True)"

#: tensor-sized reads and writes of one pass over an optimizer's tensors (weight read and
#: written, gradient read, each state tensor read and written); PMD-LAMB's trust ratio needs
#: two passes (norms before the weight is written), which this count leaves out
TENSOR_PASSES = {
    PMD_LAMB: 7,
    "AdamW(foreach=True)": 7,
    FUSED_ADAMW: 7,
    "SGD(foreach=True, momentum=0.9)": 5,
}
PROFILE_STEPS = 5


def profile_steps(
    opts: Dict[str, torch.optim.Optimizer], device: str, n_params: int, bytes_per: int
) -> None:
    """Profiles ``PROFILE_STEPS`` steps of each optimizer in ``TENSOR_PASSES`` and prints
    kernels per step, their device time against the wall clock, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for name in (n for n in TENSOR_PASSES if n in opts):
        opt = opts[name]
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            wall = time.perf_counter()
            for _ in range(PROFILE_STEPS):
                opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            wall = (time.perf_counter() - wall) / PROFILE_STEPS
        # device events but the ranges that torch.optim's annotation ("Optimizer.step#...")
        # draws on the GPU's timeline, which span the kernels rather than add to them
        kernels = [
            e
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False)
            and not e.name.startswith("Optimizer.")
        ]
        kernel_s = sum(e.time_range.elapsed_us() for e in kernels) / 1e6 / PROFILE_STEPS
        least = TENSOR_PASSES[name] * n_params * bytes_per
        by_name: Dict[str, List[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
        logger.info(
            "profile %s: %.0f kernels per step, %.2f ms of kernels in %.2f ms wall (%.0f%%); "
            "at least %.2f GB moved per step (%.0f GB/s over the kernels' time)",
            name,
            len(kernels) / PROFILE_STEPS,
            kernel_s * 1e3,
            wall * 1e3,
            100 * kernel_s / wall if wall else 0.0,
            least / 1e9,
            least / kernel_s / 1e9 if kernel_s else 0.0,
        )
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:5]
        for kernel, times_us in top:
            logger.info(
                "    %6.3f ms/step  %4d/step  %s",
                sum(times_us) / 1e3 / PROFILE_STEPS,
                len(times_us) // PROFILE_STEPS,
                kernel[:100],
            )


def spread(args: argparse.Namespace) -> None:
    """Runs the measurement in ``args.processes`` fresh processes; prints the spread."""
    runs: List[Dict[str, Dict[str, float]]] = []
    # --cold-compile: each process compiles from scratch (a run's first step on a new machine)
    cache_root = tempfile.mkdtemp(prefix="optimizer_step_inductor_") if args.cold_compile else None
    for k in range(args.processes):
        env = dict(os.environ)
        if cache_root is not None:
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, str(k))
        cmd = [sys.executable, os.path.abspath(__file__), "--rounds", str(args.rounds)]
        cmd += [
            "--warmup",
            str(max(args.warmup, 1)),
            "--device",
            args.device,
            *(["--skip-compiled"] if args.skip_compiled else []),
            "--json",
            *args.opts,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"process {k + 1} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        out = proc.stdout
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        runs.append(json.loads(line[len("RESULT ") :]))
        logger.info("process %d/%d: %s", k + 1, args.processes, ", ".join(
            f"{name} {r['median_ratio']:.2f}x" for name, r in runs[-1].items() if name != REF
        ))  # fmt: skip
    logger.info(
        "\nRatio to %s over %d fresh processes (%d rounds each): median of each process, "
        "then min / median / max over processes",
        REF,
        args.processes,
        args.rounds,
    )
    logger.info("%-32s %-34s %-22s %s", "optimizer", "per-process median ratio", "min/med/max",
                "paired min/med/max")  # fmt: skip
    for name in runs[0]:
        if name == REF:
            continue
        med = [r[name]["median_ratio"] for r in runs]
        paired = [r[name]["paired_ratio"] for r in runs]
        logger.info(
            "%-32s %-34s %.2f/%.2f/%.2fx       %.2f/%.2f/%.2fx",
            name,
            " ".join(f"{x:.2f}" for x in med),
            min(med),
            statistics.median(med),
            max(med),
            min(paired),
            statistics.median(paired),
            max(paired),
        )
    for name in (PMD_LAMB, PMD_LAMB_COMPILED):
        if name not in runs[0]:
            continue
        ok = sum(r[name]["median_ratio"] <= 1.0 for r in runs)
        logger.info("%s <= 1.0x %s (median) in %d of %d processes", name, REF, ok, len(runs))
    own = "/".join(f"{r[REF]['median_ms']:.0f}" for r in runs)
    logger.info("AdamW's own median step: %s ms", own)
    if FUSED_ADAMW in runs[0]:
        logger.info("\nRatio to %s (median of each process): min / median / max", FUSED_ADAMW)
        for name in runs[0]:
            if name != FUSED_ADAMW:
                fused = [r[name]["fused_ratio"] for r in runs]
                logger.info("%-32s %.2f/%.2f/%.2fx", name, min(fused), statistics.median(fused),
                            max(fused))  # fmt: skip
    compiled = [name for name in COMPILED if name in runs[0]]
    if compiled:
        cache = "a fresh Inductor cache each" if args.cold_compile else "Inductor's cache as found"
        logger.info("\nFirst step, compilation included, %s (s): min / median / max", cache)
        for name in compiled:
            first = [r[name]["first_step_s"] for r in runs]
            logger.info("%-32s %.1f/%.1f/%.1f", name, min(first), statistics.median(first),
                        max(first))  # fmt: skip
    if PMD_LAMB_COMPILED in runs[0]:
        goal(runs)


def goal(runs: List[Dict[str, Dict[str, float]]]) -> None:
    """The compiled PMD-LAMB step's goal (benchmarks/RESULTS.md), process by process."""
    checks = [(REF, 1.0, "median_ratio")]
    if FUSED_ADAMW in runs[0]:
        checks.append((FUSED_ADAMW, 2.5, "fused_ratio"))
    held = []
    for peer, limit, key in checks:
        ok = sum(r[PMD_LAMB_COMPILED][key] <= limit for r in runs)
        held.append(ok == len(runs))
        logger.info("goal: %s <= %.1fx %s in %d of %d processes", PMD_LAMB_COMPILED, limit, peer,
                    ok, len(runs))  # fmt: skip
    if TIMM_LAMB in runs[0]:
        ok = sum(r[PMD_LAMB_COMPILED]["median_ms"] < r[TIMM_LAMB]["median_ms"] for r in runs)
        held.append(ok == len(runs))
        logger.info("goal: %s below %s in %d of %d processes", PMD_LAMB_COMPILED, TIMM_LAMB, ok,
                    len(runs))  # fmt: skip
    else:
        logger.info("goal: timm is not installed, so the comparison with its Lamb is missing")
    verdict = "HOLDS" if all(held) and TIMM_LAMB in runs[0] else "does not hold"
    logger.info("goal %s in every process", verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed steps per optimizer")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps per optimizer first (at least 1: the first step, which compiles, "
        "is timed apart)",
    )
    parser.add_argument(
        "--cold-compile",
        action="store_true",
        help="with --processes: a fresh Inductor cache per process, so that each compiles "
        "from scratch",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh processes to measure in (spread)",
    )
    parser.add_argument(
        "--skip-compiled",
        action="store_true",
        help="leave out the compiled steps (each compiles for 10-30 s in its first step)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile a few steps of PMD-LAMB, AdamW and SGD (kernels per step, "
        "device time against wall clock, top kernels)",
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "opts",
        nargs=argparse.REMAINDER,
        help="KEY VALUE overrides of the model's config",
    )
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.processes > 1:
        spread(args)
        return

    cfg, model = build_params(args.device, args.opts)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opts = optimizers(cfg, model, args.device, compiled=not args.skip_compiled)
    names: List[str] = list(opts)
    # the first step of each optimizer, timed apart: for the compiled ones, the compilation
    first_step = {name: timed_step(opts[name], args.device)[0] for name in names}
    for _ in range(args.warmup - 1):
        for name in names:
            opts[name].step()
    times: Dict[str, List[float]] = {name: [] for name in names}
    cpu_times: Dict[str, List[float]] = {name: [] for name in names}
    faults: Dict[str, List[int]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            wall, cpu, fault = timed_step(opts[name], args.device)
            times[name].append(wall)
            cpu_times[name].append(cpu)
            faults[name].append(fault)

    where = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{platform.processor() or platform.machine()}"
    )
    logger.info(
        "Faster R-CNN R50-FPN%s: %.1fM trainable parameters, %s (%s, %s cores), torch %s, "
        "%d threads, %d rounds",
        f" ({' '.join(args.opts)})" if args.opts else "",
        n / 1e6,
        args.device,
        where,
        os.cpu_count(),
        torch.__version__,
        torch.get_num_threads(),
        args.rounds,
    )
    ref = REF
    base, cpu_base = statistics.median(times[ref]), statistics.median(cpu_times[ref])
    logger.info(
        "%-32s %12s %9s %12s %13s %9s %9s %13s",
        "optimizer",
        "median (ms)",
        "vs AdamW",
        "paired ratio",
        "CPU med (ms)",
        "vs AdamW",
        "min (ms)",
        "faults/step",
    )
    summary: Dict[str, Dict[str, float]] = {}
    for name in names:
        med, cpu_med = (
            statistics.median(times[name]),
            statistics.median(cpu_times[name]),
        )
        paired = statistics.median(t / a for t, a in zip(times[name], times[ref]))
        logger.info(
            "%-32s %12.1f %8.2fx %11.2fx %13.1f %8.2fx %9.1f %13.0f",
            name,
            med * 1e3,
            med / base,
            paired,
            cpu_med * 1e3,
            cpu_med / cpu_base,
            min(times[name]) * 1e3,
            statistics.median(faults[name]),
        )
        summary[name] = {
            "median_ms": med * 1e3,
            "median_ratio": med / base,
            "paired_ratio": paired,
            "cpu_ratio": cpu_med / cpu_base,
            "first_step_s": first_step[name],
        }
        if FUSED_ADAMW in times:
            summary[name]["fused_ratio"] = med / statistics.median(times[FUSED_ADAMW])
    compiled = [name for name in COMPILED if name in names]
    if compiled:
        logger.info(
            "first step, compilation included (s): %s",
            ", ".join(f"{name} {first_step[name]:.1f}" for name in compiled),
        )
    if args.json:
        print("RESULT " + json.dumps(summary), flush=True)
    if FUSED_ADAMW in times:
        for name in (n for n in (PMD_LAMB, PMD_LAMB_COMPILED) if n in times):
            med = statistics.median(times[name]) / statistics.median(times[FUSED_ADAMW])
            paired = statistics.median(t / a for t, a in zip(times[name], times[FUSED_ADAMW]))
            logger.info(
                "%s vs %s: median %.2fx, paired %.2fx (goal on the CPU: <= 2.5x; GPU: <= 1.1x)",
                name,
                FUSED_ADAMW,
                med,
                paired,
            )
    if args.profile:
        bytes_per = next(p for p in model.parameters() if p.requires_grad).element_size()
        profile_steps(opts, args.device, n, bytes_per)


if __name__ == "__main__":
    main()
