#!/usr/bin/env python3
"""Multigrid vs the base-shape schedule: training wall-clock and top-1, in one run.

    python projects/video/benchmarks/multigrid.py                       # the built-in demo, CPU
    python projects/video/benchmarks/multigrid.py --epoch-factors 1.5 1.0
    python projects/video/benchmarks/multigrid.py --config-file CFG [KEY VALUE ...]

Trains, one after the other in this process and with the same seed, data, network and
base schedule (``--config-file``, default the step-schedule demo
``tsm_r18w32_8f_moving_shapes_adamw_steps_bs16.yaml``, 16 epochs at 16 x 8 x 64^2, AdamW):

1. the base schedule at the base shape;
2. multigrid with the long and the short cycle, for each ``--epoch-factors`` value
   (``MULTIGRID.EPOCH_FACTOR``: 1.5 is the paper's schedule, 1.0 keeps the base
   number of epochs).

The clips are read, by default, from JPEG frames extracted once from the built-in
MP4 videos (``--data frames``; the usual set-up for Kinetics, where a clip costs the
frames it reads): decoding an MP4 costs the whole video whatever the number of frames
sampled, so with one loader worker on a small CPU the multigrid runs, whose coarse
batches hold up to 16x more clips, would time the decoder rather than the training
(``--data mp4`` measures that).

Each run's training wall-clock is timed around ``trainer.train()`` (data loading,
precise BN and checkpoints included; the evaluation excluded), then the model is
tested (10 clips x 3 crops per validation video) and the test time reported apart.
Printed: per run its epochs, steps, training time, s/step, top-1; then for each
multigrid run its speed-up (base training time / its training time) and its top-1
minus the base's. The target (Wu et al. 2020 report 4.5x on GPUs): >= 2.5x faster
with top-1 within 1 point. On a shared machine the load average before and after
each run is printed too.

With ``--csv PATH`` each run appends a row (date, CPU, torch, ``--load``: what else the
machine ran; one ``invocation`` id for the runs of one command, whose speed-ups are taken
within it); projects/video/README.md's table is generated from
``projects/video/benchmarks/results/multigrid_demo.csv`` (``python study/study_report.py``).
"""

import argparse
import datetime
import logging
import os
import sys
import time

import cv2
import largedet_video  # noqa: F401  (imports largedet first)
import numpy as np
from largedet.config.validate import ConfigError
from largedet.engine import largedet_argument_parser
from tabulate import tabulate

from largedet_video.engine import VideoTrainer, build_cfg, setup

VIDEO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(VIDEO_DIR))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from demo_speed import append_rows, cpu_class  # noqa: E402  (the CPU's name, family/model, instruction sets)

#: one row per run of an invocation
CSV_FIELDS = [
    "date", "invocation", "cpu", "cpu_family_model", "isa", "cores", "torch", "load", "config",
    "data", "schedule", "epoch_factor", "epochs", "steps", "train_s", "s_per_step", "test_s",
    "top1", "load_avg",
]  # fmt: skip
DEFAULT_CONFIG = os.path.join(
    VIDEO_DIR, "configs", "tsm_r18w32_8f_moving_shapes_adamw_steps_bs16.yaml"
)


def frame_folders(config_file, opts):
    """Extract the configured moving-shapes videos to JPEG frame folders (once, beside
    the dataset) and return the overrides that train and test on them."""
    from largedet_video.data import load_video_list, open_video, prepare_moving_shapes
    from largedet_video.data.builtin import moving_shapes_spec

    cfg = build_cfg(largedet_argument_parser().parse_args(["--config-file", config_file, *opts]))
    folder = prepare_moving_shapes(moving_shapes_spec(cfg), cfg.DATASETS.MOVING_SHAPES.ROOT)
    frames_root = folder + "_frames"
    lists = []
    for split in ("train", "val"):
        list_file = os.path.join(frames_root, f"{split}.txt")
        lists.append([f"moving_shapes_frames_{split}", list_file, frames_root])
        if os.path.isfile(list_file):
            continue
        lines = []
        for record in load_video_list(os.path.join(folder, f"{split}.txt"), root=folder):
            name = os.path.splitext(os.path.relpath(record["path"], folder))[0]
            os.makedirs(os.path.join(frames_root, name), exist_ok=True)
            with open_video(record["path"]) as video:
                frames = video.read(np.arange(video.num_frames))
            for i, frame in enumerate(frames):
                path = os.path.join(frames_root, name, f"{i:05d}.jpg")
                cv2.imwrite(path, frame[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
            lines.append(f"{name} {len(frames)} {record['label']}\n")
        with open(list_file + ".tmp", "w") as f:
            f.writelines(lines)
        os.replace(list_file + ".tmp", list_file)
    return [
        "DATASETS.VIDEO_LISTS",
        repr(lists),
        "DATASETS.TRAIN",
        "('moving_shapes_frames_train',)",
        "DATASETS.TEST",
        "('moving_shapes_frames_val',)",
    ]


#: the loggers a run's ``setup`` gives console and ``log.txt`` handlers
RUN_LOGGERS = ("detectron2", "fvcore", "largedet", "largedet_video")
#: the handlers there before the first run
_FIRST_HANDLERS = {}


def run(config_file, overrides, output_dir):
    """Train (timed), then test (timed apart); returns the row of the results table."""
    args = largedet_argument_parser().parse_args(
        ["--config-file", config_file, *overrides, "OUTPUT_DIR", output_dir]
    )
    # setup() of this run (another OUTPUT_DIR) adds handlers of its own: those of the run
    # before go, or every line would be printed once per run so far, into every log.txt
    for name in RUN_LOGGERS:
        log = logging.getLogger(name)
        kept = _FIRST_HANDLERS.setdefault(name, list(log.handlers))
        for handler in [h for h in log.handlers if h not in kept]:
            log.removeHandler(handler)
            handler.close()
    return _train_and_test(setup(args))


def _train_and_test(cfg):
    load_before = os.getloadavg()[0]
    train_cfg = cfg.clone()
    train_cfg.defrost()
    train_cfg.DATASETS.TEST = ()  # evaluate once, below, outside the training time
    train_cfg.freeze()
    trainer = VideoTrainer(train_cfg)
    trainer.resume_or_load(resume=False)
    start = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - start
    start = time.perf_counter()
    results = VideoTrainer.test(cfg, trainer.model)
    test_time = time.perf_counter() - start
    plan = trainer.multigrid
    epochs = (
        plan.schedule.max_epoch
        if plan
        else cfg.SOLVER.MAX_ITER
        * cfg.SOLVER.IMS_PER_BATCH
        / trainer.loop.data_loader.dataset_size
    )
    return {
        "epochs": epochs,
        "steps": trainer.max_iter,
        "train_s": train_time,
        "s_per_step": train_time / trainer.max_iter,
        "test_s": test_time,
        "top1": results["classification"]["top1"],
        "load": f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}",
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config-file", default=DEFAULT_CONFIG)
    parser.add_argument("--epoch-factors", type=float, nargs="+", default=[1.5])
    parser.add_argument("--output", default="output/video/benchmarks/multigrid")
    parser.add_argument(
        "--data",
        choices=["frames", "mp4"],
        default="frames",
        help="read clips from extracted JPEG frames (default) or decode the MP4 files",
    )
    parser.add_argument("--csv", help="append one row per run to this CSV")
    parser.add_argument("--load", default="", help="what else the machine ran (the CSV's load column)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")
    args = parser.parse_args()
    opts = list(args.opts)
    try:  # the config, read once before any run: a config error is one line
        build_cfg(largedet_argument_parser().parse_args(["--config-file", args.config_file, *opts]))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.data == "frames":
        opts += frame_folders(args.config_file, opts)

    invocation = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    variants = [("base shape", [])] + [
        (
            f"multigrid, {f:g}x epochs",
            ["MULTIGRID.LONG_CYCLE", "True", "MULTIGRID.SHORT_CYCLE", "True"]
            + ["MULTIGRID.EPOCH_FACTOR", str(f)],
        )
        for f in args.epoch_factors
    ]
    rows = {}
    for i, (name, overrides) in enumerate(variants):
        rows[name] = run(args.config_file, opts + overrides, os.path.join(args.output, str(i)))
        logging.getLogger("largedet_video").info("%s: %s", name, rows[name])
        if args.csv:  # each run as it ends: a crash keeps the runs before it
            factor = "" if i == 0 else f"{args.epoch_factors[i - 1]:g}"
            append_row(args.csv, invocation, rows[name], factor, args)

    print(f"\nconfig {args.config_file} {' '.join(args.opts)}; data: {args.data}")
    print(
        tabulate(
            [
                (
                    name,
                    f"{r['epochs']:g}",
                    r["steps"],
                    f"{r['train_s']:.0f}",
                    f"{r['s_per_step']:.3f}",
                    f"{r['top1']:.1f}",
                    f"{r['test_s']:.0f}",
                    r["load"],
                )
                for name, r in rows.items()
            ],
            headers=[
                "schedule",
                "epochs",
                "steps",
                "training s",
                "s/step",
                "top-1 %",
                "test s",
                "load avg",
            ],
            tablefmt="pipe",
        )
    )
    base = rows["base shape"]
    for name, r in rows.items():
        if name == "base shape":
            continue
        speedup = base["train_s"] / r["train_s"]
        diff = r["top1"] - base["top1"]
        target = "meets" if speedup >= 2.5 and diff >= -1.0 else "misses"
        print(
            f"{name}: {speedup:.2f}x faster training ({base['steps'] / r['steps']:.2f}x fewer "
            f"steps), top-1 {diff:+.1f} points against the base shape ({target} the "
            f">= 2.5x, within 1 point target)"
        )


def append_row(path, invocation, result, epoch_factor, args):
    """One run's row: ``epoch_factor`` "" for the base shape, else multigrid's factor."""
    import torch

    row = {
        "date": datetime.date.today().isoformat(), "invocation": invocation, **cpu_class(),
        "torch": torch.__version__, "load": args.load,
        "config": os.path.relpath(os.path.abspath(args.config_file), ROOT)
        + "".join(f" {o}" for o in args.opts),
        "data": args.data, "schedule": "multigrid" if epoch_factor else "base",
        "epoch_factor": epoch_factor, "epochs": f"{result['epochs']:g}", "steps": result["steps"],
        "train_s": f"{result['train_s']:.1f}", "s_per_step": f"{result['s_per_step']:.4f}",
        "test_s": f"{result['test_s']:.1f}", "top1": f"{result['top1']:.2f}", "load_avg": result["load"],
    }  # fmt: skip
    append_rows(path, [row], CSV_FIELDS)


if __name__ == "__main__":
    main()
