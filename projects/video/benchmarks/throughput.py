#!/usr/bin/env python3
"""Training throughput of TSM vs TSN vs I3D, and decoding throughput of each video decoder.

    python projects/video/benchmarks/throughput.py                    # CPU: 8 x 112px clips
    python projects/video/benchmarks/throughput.py --device cuda      # GPU: 8 x 224px clips
    python projects/video/benchmarks/throughput.py --decoders         # decoding only, all decoders
    python projects/video/benchmarks/throughput.py --decoders pyav torchcodec

1. Training clips/s (forward, backward and SGD step on random clips, all models
   given the same input: 8 frames of --size pixels) for TSM, TSN (the same
   ResNet-50 without the shift), TSM with a naive shift (slice assignments into
   a zero tensor, for comparison) and the two I3D ResNet-50 baselines. Models
   are timed in interleaved rounds (every round times each model once) and the
   median round is reported, so that load changes on a shared machine hit all
   models alike. On the CPU, process CPU time per clip is reported too, and
   torch runs one thread by default (--threads): on a shared machine, threads
   waiting for busy cores would dominate the timings. FLOPs per clip (fvcore)
   and parameter counts are printed beside.
2. Decoding clips/s of one worker (the process pinned to one core where the OS
   allows): open a video and read 8 TSN-sampled frames (one clip), with each
   decoder of INPUT.VIDEO.DECODER that loads here (PyAV, OpenCV, torchcodec on
   the CPU; torchcodec on NVDEC with --device cuda), on two sets: the built-in
   moving-shapes videos (the first 16 training videos of the demo's dataset,
   96x72, 32 frames, H.264, generated to a temporary folder) and a generated
   340x256, 10 s, 25 fps H.264 video (Kinetics' usual size). Decoders and sets
   are timed in interleaved rounds of --decode-seconds each; the median round
   and the range over --decode-rounds rounds are printed, with clips per
   CPU-second (process CPU time, steadier than wall clock on a shared machine).
   --decoders runs this part alone.

Ratios printed: TSM / I3D 3x3x3 and TSM / I3D 3x1x1 (the TSM paper: 1.6x and
2.9x), the shift's cost against TSN (goal: <= 3%), each decoder / PyAV.

``--csv PREFIX`` appends the figures to ``PREFIX_training.csv`` (one row per model) and
``PREFIX_decoding.csv`` (one row per decoder and video set), with the date, CPU, torch
and ``--load`` (what else the machine ran); projects/video/README.md's tables are generated
from ``projects/video/benchmarks/results/throughput_*.csv`` (``python study/study_report.py``).
"""

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import tempfile
import time

import largedet_video  # noqa: F401  (imports largedet first)
import numpy as np
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage
from fvcore.nn import FlopCountAnalysis

from largedet_video import add_video_config
from largedet_video.data import open_video
from largedet_video.data.decoding import torchcodec_unavailable
from largedet_video.data.moving_shapes import (
    MovingShapesSpec,
    load_moving_shapes,
    prepare_moving_shapes,
    render_moving_shape,
    write_mp4,
)
from largedet_video.data.sampling import segment_train_indices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from demo_speed import append_rows, cpu_class  # noqa: E402  (the CPU's name, family/model, instruction sets)

MACHINE_FIELDS = ["date", "invocation", "cpu", "cpu_family_model", "isa", "cores", "torch", "device", "load"]
TRAINING_FIELDS = MACHINE_FIELDS + [
    "depth", "width", "size", "frames", "batch", "threads", "rounds", "steps", "model", "clips_s",
    "clips_cpu_s", "gflops", "params_m",
]  # fmt: skip
DECODING_FIELDS = MACHINE_FIELDS + [
    "video_set", "decoder", "rounds", "seconds", "clips_s", "clips_s_min", "clips_s_max", "clips_cpu_s",
]  # fmt: skip
from largedet_video.modeling.backbone import RESNET_LAYERS, resnet

MODELS = {
    # name: (backbone, I3D variant)
    "TSN": ("TSNResNet", ""),
    "TSM": ("TSMResNet", ""),
    "TSM (naive shift)": ("TSMResNet", ""),
    "I3D 3x3x3": ("I3DResNet", "3x3x3"),
    "I3D 3x1x1": ("I3DResNet", "3x1x1"),
}


def naive_shift(x, num_segments, fold_div=8, impl=None):
    """The straightforward shift: a zero tensor and slice assignments into it
    (autograd then copies the whole gradient once per assignment). ``impl``, the backbone's
    ``MODEL.VIDEO.TSM.SHIFT_IMPL``, is not used: this is the implementation."""
    nt, c, h, w = x.shape
    x = x.view(nt // num_segments, num_segments, c, h, w)
    fold = c // fold_div
    out = torch.zeros_like(x)
    out[:, :-1, :fold] = x[:, 1:, :fold]
    out[:, 1:, fold : 2 * fold] = x[:, :-1, fold : 2 * fold]
    out[:, :, 2 * fold :] = x[:, :, 2 * fold :]
    return out.view(nt, c, h, w)


@contextlib.contextmanager
def shift_function(fn):
    saved = resnet.temporal_shift
    resnet.temporal_shift = fn
    try:
        yield
    finally:
        resnet.temporal_shift = saved


def build(backbone, variant, depth, width, device):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.MODEL.DEVICE = device
    cfg.MODEL.VIDEO.BACKBONE = backbone
    cfg.MODEL.VIDEO.I3D.VARIANT = variant or "3x3x3"
    cfg.MODEL.VIDEO.RESNET.DEPTH = depth
    cfg.MODEL.VIDEO.RESNET.WIDTH = width
    cfg.MODEL.VIDEO.NUM_CLASSES = 400
    return build_model(cfg).train()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train_steps(model, opt, batch, steps, device, naive):
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    with shift_function(naive_shift) if naive else contextlib.nullcontext():
        for _ in range(steps):
            loss = model(batch)["loss_cls"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_training(args, names):
    device = args.device
    clip = torch.randint(
        0, 256, (args.batch, args.frames, 3, args.size, args.size), dtype=torch.uint8
    )
    batch = {"clip": clip.to(device), "label": torch.randint(0, 400, (args.batch,), device=device)}
    models = {}
    for name in names:
        backbone, variant = MODELS[name]
        torch.manual_seed(0)
        model = build(backbone, variant, args.depth, args.width, device)
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
    wall = {name: [] for name in models}
    cpu = {name: [] for name in models}
    with EventStorage():
        for name, (model, opt) in models.items():
            train_steps(model, opt, batch, args.warmup, device, "naive" in name)
        for _ in range(args.rounds):
            for name, (model, opt) in models.items():
                w, c = train_steps(model, opt, batch, args.steps, device, "naive" in name)
                wall[name].append(args.steps * args.batch / w)
                cpu[name].append(args.steps * args.batch / c)
    flops = {}
    for name, (model, _) in models.items():
        model.eval()
        x = model.preprocess(clip[:1].to(device))
        counter = (
            FlopCountAnalysis(model.backbone, x)
            .unsupported_ops_warnings(False)
            .uncalled_modules_warnings(False)
        )
        flops[name] = counter.total()
    params = {
        name: sum(p.numel() for p in model.parameters()) for name, (model, _) in models.items()
    }
    median = statistics.median
    return (
        {n: median(v) for n, v in wall.items()},
        {n: median(v) for n, v in cpu.items()},
        flops,
        params,
    )


def make_video(path, frames, width, height):
    spec = MovingShapesSpec(
        num_frames=frames, width=width, height=height, radius=(20, 40), speed=(3, 6)
    )
    write_mp4(path, render_moving_shape(np.random.default_rng(0), "right", spec), fps=25)


def available_decoders(device):
    """{decoder: None if it runs here, else why not}, in the order of the table."""
    reason = torchcodec_unavailable()
    gpu = None if device.startswith("cuda") else "only with --device cuda"
    return {
        "pyav": None,
        "opencv": None,
        "torchcodec": reason,
        "torchcodec_cuda": reason or gpu,
    }


def decode_clips(paths, decoder, seconds, rng):
    """(clips/s, clips per CPU-second) of one decoder reading 8 TSN-sampled
    frames per clip, going round ``paths``, for ``seconds`` (at least one clip)."""
    clips, wall, cpu = 0, time.perf_counter(), time.process_time()
    while clips == 0 or time.perf_counter() - wall < seconds:
        with open_video(paths[clips % len(paths)], decoder) as video:
            video.read(segment_train_indices(video.num_frames, 8, rng))
        clips += 1
    return clips / (time.perf_counter() - wall), clips / (time.process_time() - cpu)


def bench_decoding(video_sets, decoders, seconds, rounds):
    """{set: {decoder: ([clips/s per round], [clips/CPU-s per round])}}, the
    rounds interleaved over sets and decoders."""
    rng = np.random.default_rng(0)
    result = {name: {d: ([], []) for d in decoders} for name in video_sets}
    for name, paths in video_sets.items():  # warm-up: first opens, library loads
        for decoder in decoders:
            decode_clips(paths, decoder, 0.0, rng)
    for _ in range(rounds):
        for name, paths in video_sets.items():
            for decoder in decoders:
                wall, cpu = decode_clips(paths, decoder, seconds, rng)
                result[name][decoder][0].append(wall)
                result[name][decoder][1].append(cpu)
    return result


def run_decoding(args, decoders):
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        # The same frames as the first 16 training videos of the built-in dataset.
        shapes = prepare_moving_shapes(MovingShapesSpec(num_train=16, num_val=1), tmp)
        kinetics_like = os.path.join(tmp, "kinetics_like.mp4")
        make_video(kinetics_like, 250, 340, 256)
        video_sets = {
            "built-in moving shapes (16 videos, 96x72, 32 frames, H.264)": [
                r["path"] for r in load_moving_shapes(shapes, "train")
            ],
            "Kinetics-like (340x256, 10 s, 25 fps, H.264)": [kinetics_like],
        }
        results = bench_decoding(video_sets, decoders, args.decode_seconds, args.decode_rounds)
    print(
        "Decoding, one worker (one core), 8 TSN-sampled frames per clip; median "
        f"[min-max] of {args.decode_rounds} rounds of {args.decode_seconds:g} s:"
    )
    median = statistics.median
    for name, rates in results.items():
        print(f"  {name}:")
        for decoder, (wall, cpu) in rates.items():
            print(
                f"    {decoder:16s} {median(wall):8.2f} clips/s [{min(wall):.2f}-{max(wall):.2f}]"
                f"  {median(cpu):8.2f} clips/CPU-s"
            )
        for decoder in decoders[1:]:
            if "pyav" in rates:
                ratio = median(rates[decoder][0]) / median(rates["pyav"][0])
                print(f"    {decoder} / PyAV: {ratio:.2f}x")
    return results


def machine_columns(args):
    """The columns every row of one invocation shares."""
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    return {"date": datetime.date.today().isoformat(), "invocation": args.invocation, **cpu_class(),
            "torch": torch.__version__, "device": device, "load": args.load}  # fmt: skip


def training_rows(args, names, wall, cpu, flops, params):
    gpu = args.device.startswith("cuda")
    return [{
        "depth": args.depth, "width": args.width, "size": args.size, "frames": args.frames,
        "batch": args.batch, "threads": torch.get_num_threads(), "rounds": args.rounds, "steps": args.steps,
        "model": name, "clips_s": f"{wall[name]:.3f}", "clips_cpu_s": "" if gpu else f"{cpu[name]:.3f}",
        "gflops": f"{flops[name] / 1e9:.2f}", "params_m": f"{params[name] / 1e6:.2f}",
    } for name in names]  # fmt: skip


def decoding_rows(args, results):
    median = statistics.median
    return [{
        "video_set": name, "decoder": decoder, "rounds": args.decode_rounds, "seconds": args.decode_seconds,
        "clips_s": f"{median(wall):.3f}", "clips_s_min": f"{min(wall):.3f}", "clips_s_max": f"{max(wall):.3f}",
        "clips_cpu_s": f"{median(cpu):.3f}",
    } for name, rates in results.items() for decoder, (wall, cpu) in rates.items()]  # fmt: skip


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--size", type=int, default=0, help="frame side (default 224 on GPU, 112 on CPU)"
    )
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument(
        "--batch", type=int, default=0, help="clips per step (default 8 on GPU, 2 on CPU)"
    )
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--width", type=int, default=64, help="ResNet width (64: the real one)")
    parser.add_argument(
        "--steps", type=int, default=0, help="steps per timed round (default 20 GPU, 2 CPU)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 1 on CPU)")
    parser.add_argument(
        "--decode-seconds", type=float, default=5.0, help="seconds per decoder and round"
    )
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument(
        "--decoders",
        nargs="*",
        metavar="NAME",
        help="decoding only, with these decoders (none named: every one that runs here)",
    )
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--csv", metavar="PREFIX", help="append the figures to PREFIX_training.csv and PREFIX_decoding.csv")
    parser.add_argument("--load", default="", help="what else the machine ran (the CSVs' load column)")
    args = parser.parse_args()
    args.invocation = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    gpu = args.device.startswith("cuda")
    args.size = args.size or (224 if gpu else 112)
    args.batch = args.batch or (8 if gpu else 2)
    args.steps = args.steps or (20 if gpu else 2)
    if args.threads or not gpu:
        torch.set_num_threads(args.threads or 1)

    name = (
        torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} torch thread(s)"
    )
    print(f"Device: {name}; torch {torch.__version__}")
    available = available_decoders(args.device)
    for decoder in args.decoders or []:
        if available.get(decoder, "unknown decoder"):
            parser.error(f"decoder {decoder}: {available.get(decoder, 'unknown decoder')}")
    decoders = args.decoders or [d for d, reason in available.items() if reason is None]
    for decoder, reason in available.items():
        if reason and decoder not in decoders:
            print(f"  (no {decoder}: {reason})")
    if args.decoders is not None:
        results = run_decoding(args, decoders)
        if args.csv:
            machine = machine_columns(args)
            append_rows(args.csv + "_decoding.csv", [{**machine, **r} for r in decoding_rows(args, results)], DECODING_FIELDS)
        return
    print(
        f"Training: ResNet-{args.depth} (width {args.width}), {args.batch} clips x {args.frames} frames x "
        f"{args.size}x{args.size} per step; median of {args.rounds} rounds of {args.steps} steps"
    )
    names = list(MODELS)
    if RESNET_LAYERS[args.depth][0] != "bottleneck":
        names = [n for n in names if not n.startswith("I3D")]
        print(f"  (no I3D: the I3D baselines are bottleneck ResNets, not ResNet-{args.depth})")
    wall, cpu, flops, params = bench_training(args, names)
    if args.csv:
        machine = machine_columns(args)
        rows = [{**machine, **r} for r in training_rows(args, names, wall, cpu, flops, params)]
        append_rows(args.csv + "_training.csv", rows, TRAINING_FIELDS)
    for model in names:
        extra = "" if gpu else f"  {cpu[model]:7.2f} clips/CPU-s"
        print(
            f"  {model:18s} {wall[model]:8.2f} clips/s{extra}  "
            f"{flops[model] / 1e9:6.1f} GFLOPs/clip  {params[model] / 1e6:5.1f}M params"
        )
    if "I3D 3x3x3" in wall:
        print(f"  TSM / I3D 3x3x3:  {wall['TSM'] / wall['I3D 3x3x3']:.2f}x   (paper: 1.6x)")
        print(f"  TSM / I3D 3x1x1:  {wall['TSM'] / wall['I3D 3x1x1']:.2f}x   (paper: 2.9x)")
    print(f"  shift cost vs TSN: {100 * (1 - wall['TSM'] / wall['TSN']):+.1f}% wall", end="")
    print("" if gpu else f", {100 * (1 - cpu['TSM'] / cpu['TSN']):+.1f}% CPU time", end="")
    print(
        f"; naive shift {100 * (1 - wall['TSM (naive shift)'] / wall['TSN']):+.1f}% wall"
        " (goal <= 3%)"
    )

    if not args.skip_decode:
        results = run_decoding(args, decoders)
        if args.csv:
            machine = machine_columns(args)
            append_rows(args.csv + "_decoding.csv", [{**machine, **r} for r in decoding_rows(args, results)], DECODING_FIELDS)


if __name__ == "__main__":
    main()
