#!/usr/bin/env python3
"""Multigrid's training speed-up on TSM-R50 at 8 x 224^2, from measured step times per shape.

    python projects/video/benchmarks/multigrid_speed.py --device cuda        # H100 check
    python projects/video/benchmarks/multigrid_speed.py --device cpu --max-seconds 120 \\
        MODEL.VIDEO.RESNET.DEPTH 10 MODEL.VIDEO.RESNET.WIDTH 8 INPUT.VIDEO.TRAIN_CROP_SIZE 32 \\
        SOLVER.IMS_PER_DEVICE 2 MULTIGRID.BN_BASE_SIZE 2                  # CPU dry run

The schedules are the project's: ``build_multigrid_plan`` of ``--config-file`` (default
``kinetics400_tsm_r50_8f_multigrid.yaml``: base shape 8 clips x 8 frames x 224^2 per
device, LR steps at epochs 60 and 85 of 100) on ``--num-samples`` training clips (240,000:
Kinetics-400) and ``--num-devices`` devices, once per ``--epoch-factors`` value
(``MULTIGRID.EPOCH_FACTOR``: 1.0 = the base number of epochs, 1.5 = the paper's), and the
base schedule as the same function with both cycles off and factor 1.0 (every stage at the
base shape). Its length in epochs is the config's, ``SOLVER.MAX_ITER x IMS_PER_BATCH /
--num-samples`` (100 for the default config on 240,000 clips). The per-device batches of
every epoch, and the shape of each, are counted with the project's
``MultigridBatchSampler`` (its ``num_batches`` and ``shape_at``, ``drop_last`` as in
training).

The models are the project's (``build_model`` of the same config): the multigrid one with
sub-batch BN (``MULTIGRID.BN_BASE_SIZE``) times every shape the multigrid schedules use,
the base one (plain BN, multigrid off) the base shape, and with ``--plain-bn-too`` the
multigrid shapes as well (multigrid's speed-up without sub-batch BN's cost). A step is one
per-device batch's forward, backward and SGD step (the paper's 1536-device layout, one
batch per step and device) on random uint8 clips already on the device: data loading, the
all-reduce, precise BN at stage ends and evaluation are excluded. Every (model, shape) pair
is timed in interleaved rounds of ``--steps`` steps, in a fresh random order each round,
after ``--warmup`` untimed steps; its step time is the median over rounds.

A schedule's training time is the sum over shapes of (per-device batches of that shape) x
(its step time); the speed-up is the base schedule's time over the multigrid schedule's
(for a given number of epochs, independent of the data set's size up to the rounding of
each epoch's last batch). The goal at equal epochs (factor 1.0): >= 3x.

``--max-seconds`` is a hard limit, counted from the end of the imports: no round starts
that would end past it, and an alarm stops a step that runs over; the figures of the
complete rounds are printed either way (no speed-up if no round completed).

The last line is ``GPU-CHECK-FIGURES {json}`` with the keys: ``device``, ``torch``,
``config`` (file, overrides, amp, cudnn_benchmark), ``num_samples``, ``num_devices``,
``shapes`` (a list of ``{"model": "base" | "multigrid", "shape": "BxTxS", "batch",
"frames", "crop", "step_ms", "step_ms_range", "clips_per_s"}``), ``schedules`` (name ->
``{"epochs", "batches" (shape -> per-device batches), "total_batches", "train_s"}``, the
names ``"base"``, ``"multigrid x<factor>"`` and, with ``--plain-bn-too``, ``"multigrid
x<factor> plain BN"``), ``speedup`` (factor -> base train_s over multigrid train_s),
``speedup_plain_bn`` (the same on the plain-BN model's step times), ``batch_ratio`` (factor
-> base batches over multigrid batches: the speed-up if every step took the same time),
``subbatch_bn_cost`` (multigrid model over base model step time at the base shape),
``rounds``, ``setup_s``, ``elapsed_s``, ``stopped_by_time``, ``errors`` ("<model>
<shape>" -> the error that dropped the pair; no speed-up then).
"""

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from collections import Counter

import largedet_video  # noqa: F401  (imports largedet first)
import torch
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from largedet.config.validate import ConfigError
from largedet.engine import largedet_argument_parser

from largedet_video.engine import build_cfg
from largedet_video.multigrid import MultigridBatchSampler, build_multigrid_plan
from step_timing import ALARM, AMP_DTYPES, start_run, sync

VIDEO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(VIDEO_DIR, "configs", "kinetics400_tsm_r50_8f_multigrid.yaml")
GOAL = 3.0


def with_overrides(cfg, *pairs):
    cfg = cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(list(pairs))
    cfg.freeze()
    return cfg


def voxels(shape) -> int:
    """A batch's voxels: clips x frames x crop x crop."""
    return shape.batch_size * shape.num_frames * shape.crop_size**2


def count_batches(plan):
    """{ClipShape: per-device batches of the whole schedule}, counted with the sampler
    that trains it: each stage's epoch, shape by shape, times the stage's epochs."""
    sampler = MultigridBatchSampler(
        plan.num_samples, plan.schedule, seed=0, rank=0, world_size=plan.world_size
    )
    counts = Counter()
    for stage in plan.schedule.stages:
        if not stage.num_epochs:
            continue
        sampler.set_epoch(stage.start_epoch)
        epoch = Counter(sampler.shape_at(i) for i in range(len(sampler)))
        for shape, n in epoch.items():
            counts[shape] += n * stage.num_epochs
    if sum(counts.values()) != plan.total_batches:
        raise RuntimeError(
            f"Counted {sum(counts.values())} batches, the plan has {plan.total_batches}."
        )
    return counts


class ShapeRunner:
    """One (model, shape) pair: its random batch on the device and its training steps."""

    def __init__(self, model, opt, shape, num_classes, device, amp):
        self.model, self.opt, self.shape, self.device = model, opt, shape, device
        self.amp = AMP_DTYPES[amp]
        clip = torch.randint(
            0, 256, (shape.batch_size, shape.num_frames, 3, shape.crop_size, shape.crop_size),
            dtype=torch.uint8,
        )  # fmt: skip
        self.batch = {
            "clip": clip.to(device),
            "label": torch.randint(0, num_classes, (shape.batch_size,)).to(device),
        }

    def steps(self, n):
        """Seconds per step over ``n`` steps."""
        device_type = "cuda" if self.device.startswith("cuda") else "cpu"
        sync(self.device)
        start = time.perf_counter()
        for _ in range(n):
            autocast = torch.autocast(device_type, dtype=self.amp, enabled=self.amp is not None)
            with autocast:
                loss = self.model(self.batch)["loss_cls"]
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        sync(self.device)
        return (time.perf_counter() - start) / n


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--config-file", default=DEFAULT_CONFIG)
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--num-samples", type=int, default=240_000, help="training clips per epoch")
    add("--num-devices", type=int, default=1, help="devices the schedule is laid out on")
    add("--epoch-factors", type=float, nargs="+", default=[1.0, 1.5])
    add("--amp", choices=sorted(AMP_DTYPES), default="none")
    add("--steps", type=int, default=5, help="timed steps per shape and round")
    add("--rounds", type=int, default=12, help="at most this many rounds")
    add("--warmup", type=int, default=3, help="untimed steps per shape")
    add("--plain-bn-too", action="store_true",
        help="also time the multigrid shapes on the base model (plain BN)")
    add("--max-seconds", type=float, default=80.0)
    add("--threads", type=int, default=1, help="torch threads on the CPU")
    add("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")
    return parser.parse_args()


def build_plans(cfg, args):
    """(the base config, {schedule name: MultigridPlan}): the base schedule (both cycles
    off, epoch factor 1) and multigrid at each ``--epoch-factors`` value."""
    base_cfg = with_overrides(
        cfg, "MULTIGRID.LONG_CYCLE", False, "MULTIGRID.SHORT_CYCLE", False,
        "MULTIGRID.EPOCH_FACTOR", 1.0,
    )  # fmt: skip
    plans = {"base": build_multigrid_plan(base_cfg, args.num_samples, args.num_devices)}
    for f in args.epoch_factors:
        mg_cfg = with_overrides(cfg, "MULTIGRID.EPOCH_FACTOR", f)
        plan = build_multigrid_plan(mg_cfg, args.num_samples, args.num_devices)
        plans[f"multigrid x{f:g}"] = plan
    return base_cfg, plans


def measure(args, model_cfgs, shapes, deadline, step_s, errors):
    """Time every (model, shape) pair in interleaved rounds; appends each complete
    round's seconds per step to ``step_s[(model, shape)]`` and returns the rounds. A pair
    whose warm-up fails (out of memory, say) is dropped, its error in ``errors``."""
    runners = {}
    for model_name, model_cfg in model_cfgs.items():
        torch.manual_seed(0)
        model = build_model(model_cfg).train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        for shape in shapes[model_name]:
            runners[(model_name, shape)] = ShapeRunner(
                model, opt, shape, model_cfg.MODEL.VIDEO.NUM_CLASSES, args.device, args.amp
            )
    rounds, last = 0, 0.0
    with EventStorage():
        for key, runner in list(runners.items()) if args.warmup else []:
            try:
                runner.steps(args.warmup)
            except Exception as e:
                if ALARM["rang"]:
                    raise
                errors[f"{key[0]} {key[1]}"] = f"{type(e).__name__}: {e}"[:500]
                print(f"  {key[0]} {key[1]} dropped: {errors[f'{key[0]} {key[1]}']}", flush=True)
                del runners[key]
                runner.model.zero_grad(set_to_none=True)
        for _ in range(args.rounds):
            if time.perf_counter() + 1.2 * last > deadline:
                break
            start = time.perf_counter()
            order = random.sample(list(runners), len(runners))
            measured = {key: runners[key].steps(args.steps) for key in order}
            for key, seconds in measured.items():
                step_s.setdefault(key, []).append(seconds)
            rounds += 1
            last = time.perf_counter() - start
    return rounds


def _row_order(key):
    model_name, shape = key
    return model_name, shape.num_frames, shape.crop_size


def report(args, plans, counts, step_s, figures):
    """Print the step times, each schedule's time and the speed-ups; fill ``figures``."""
    median = {key: statistics.median(v) for key, v in step_s.items()}
    # each shape's time per voxel (clips x frames x crop^2) over the plain-BN model's at the
    # base shape: 1.0 where a step's cost follows its voxels exactly
    base_shape = plans["base"].schedule.base_shape
    base_step = median.get(("base", base_shape))
    base_per_voxel = None if base_step is None else base_step / voxels(base_shape)
    figures["shapes"] = []
    for model_name, shape in sorted(step_s, key=_row_order):
        v, step = step_s[(model_name, shape)], median[(model_name, shape)]
        row = {
            "model": model_name,
            "shape": str(shape),
            "batch": shape.batch_size,
            "frames": shape.num_frames,
            "crop": shape.crop_size,
            "step_ms": 1000 * step,
            "step_ms_range": [1000 * min(v), 1000 * max(v)],
            "clips_per_s": shape.batch_size / step,
        }
        if base_per_voxel is not None:
            row["per_voxel_vs_base"] = step / voxels(shape) / base_per_voxel
        figures["shapes"].append(row)
    print(
        f"Step times, median of {figures['rounds']} round(s) of {args.steps} step(s); "
        f"per voxel: over the plain-BN model's at the base shape {base_shape}:"
    )
    for row in figures["shapes"]:
        lo, hi = row["step_ms_range"]
        rel = row.get("per_voxel_vs_base")
        print(
            f"  {row['model']:9s} {row['shape']:>12s}  {row['step_ms']:9.2f} ms/step "
            f"[{lo:.2f}-{hi:.2f}]  {row['clips_per_s']:8.1f} clips/s"
            + (f"  {rel:5.2f}x per voxel" if rel is not None else "")
        )
    figures.update(schedules={}, speedup={}, batch_ratio={}, speedup_plain_bn={})
    needed = {("base" if n == "base" else "multigrid", s) for n in plans for s in counts[n]}
    if not needed <= set(median):
        return
    # (schedule, the model that trains it); multigrid on the plain-BN model where timed
    timed = [(n, "base" if n == "base" else "multigrid") for n in plans]
    timed += [(n, "base") for n in plans if n != "base" and args.plain_bn_too]
    for plan_name, model_name in timed:
        plan = plans[plan_name]
        train_s = sum(n * median[(model_name, shape)] for shape, n in counts[plan_name].items())
        key = plan_name + (" plain BN" if plan_name != "base" and model_name == "base" else "")
        figures["schedules"][key] = {
            "epochs": plan.schedule.max_epoch,
            "batches": {str(s): n for s, n in counts[plan_name].items()},
            "total_batches": plan.total_batches,
            "train_s": train_s,
        }
        print(
            f"  {key:25s} {plan.schedule.max_epoch:4d} epochs  {plan.total_batches:9d} "
            f"batches per device  {train_s / 3600:8.2f} h of steps per device"
        )
    base = figures["schedules"]["base"]
    for f in args.epoch_factors:
        mg = figures["schedules"][f"multigrid x{f:g}"]
        speedup = figures["speedup"][f"{f:g}"] = base["train_s"] / mg["train_s"]
        ratio = figures["batch_ratio"][f"{f:g}"] = base["total_batches"] / mg["total_batches"]
        goal = ""
        if f == 1.0:
            goal = f"; goal >= {GOAL:g}x at equal epochs {'met' if speedup >= GOAL else 'missed'}"
        print(f"  multigrid x{f:g} epochs: {speedup:.2f}x faster ({ratio:.2f}x fewer steps){goal}")
        plain = figures["schedules"].get(f"multigrid x{f:g} plain BN")
        if plain:
            figures["speedup_plain_bn"][f"{f:g}"] = base["train_s"] / plain["train_s"]
            print(f"    with plain BN: {base['train_s'] / plain['train_s']:.2f}x faster")
    if ("multigrid", base_shape) in median:
        cost = median[("multigrid", base_shape)] / median[("base", base_shape)]
        figures["subbatch_bn_cost"] = cost
        print(f"  sub-batch BN at the base shape: {cost:.3f}x the plain-BN step time")


def main():
    args = parse_args()
    t0, deadline, name = start_run(args)

    overrides = ["MODEL.DEVICE", args.device, "MODEL.VIDEO.PRETRAINED", "", *args.opts]
    try:
        cfg = build_cfg(
            largedet_argument_parser().parse_args(["--config-file", args.config_file, *overrides])
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
    base_cfg, plans = build_plans(cfg, args)
    counts = {name: count_batches(plan) for name, plan in plans.items()}
    multigrid_shapes = {s for n in plans if n != "base" for s in counts[n]}
    base_shapes = set(counts["base"]) | (multigrid_shapes if args.plain_bn_too else set())
    shapes = {
        "base": sorted(base_shapes, key=lambda s: (s.num_frames, s.crop_size)),
        "multigrid": sorted(multigrid_shapes, key=lambda s: (s.num_frames, s.crop_size)),
    }

    print(
        f"Device: {name}; torch {torch.__version__}; {os.path.basename(args.config_file)} "
        f"{' '.join(args.opts)}; AMP {args.amp}, cudnn.benchmark {torch.backends.cudnn.benchmark}",
        flush=True,
    )
    for plan_name, plan in plans.items():
        print(f"{plan_name}: {plan.schedule.format_table()}", flush=True)
    figures = {
        "device": name,
        "torch": torch.__version__,
        "config": {
            "file": os.path.basename(args.config_file),
            "overrides": args.opts,
            "amp": args.amp,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
        },
        "num_samples": args.num_samples,
        "num_devices": args.num_devices,
        "setup_s": time.perf_counter() - t0,
        "errors": {},
    }
    step_s = {}
    figures["rounds"], stopped = 0, False
    try:
        figures["rounds"] = measure(
            args, {"base": base_cfg, "multigrid": cfg}, shapes, deadline, step_s, figures["errors"]
        )
    except Exception:
        if not ALARM["rang"]:
            raise
        stopped = True
        # a round cut by the alarm was never recorded: the lists hold complete rounds
        figures["rounds"] = len(next(iter(step_s.values()), []))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    report(args, plans, counts, step_s, figures)
    figures.update(
        elapsed_s=time.perf_counter() - t0,
        stopped_by_time=stopped or figures["rounds"] < args.rounds,
    )
    print("GPU-CHECK-FIGURES " + json.dumps(figures, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
