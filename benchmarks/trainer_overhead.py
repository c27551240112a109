"""Images/s of Detectron2's ``DefaultTrainer`` against largedet's ``Trainer`` on one config.

Both trainers are built from the same config (by default the demo's
``configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``: Faster R-CNN R18-FPN, SGD, 8 images
per step, one loader worker), from the same seed (the config's ``SEED``; -1 draws one for
each), each with its own model, loader, optimizer and hooks, and no evaluation
(``DATASETS.TEST ()``, no checkpoint in or after the run). They
train in alternating rounds of ``--iters`` steps, the order swapped every round, so that a
shared machine slows both alike. A round is Detectron2's training loop
(``TrainerBase.train``: hooks before and after each step, ``run_step``) for ``--iters``
steps, between two ``torch.cuda.synchronize`` on a GPU; the trainers' ``before_train`` runs
once before the first round. Prints each trainer's median step time and images/s (wall clock;
CPU time of this process, loader workers not included) and largedet / Detectron2 in images/s:
the ratio of the medians and the median of the per-round ratios, with the spread over rounds.
The trainer that waits keeps its loader workers, which fill their prefetch queues meanwhile
(``DATALOADER.NUM_WORKERS`` x 2 images), alike for both.

``--ims-per-batch 2 4`` measures several ``SOLVER.IMS_PER_BATCH`` in one run, one after the
other, both trainers built afresh for each. ``--coco-images N`` trains on N generated
COCO-size JPEGs (``benchmarks/synthetic_coco.py``: COCO's frequent sizes, about 640 x 480,
about 150 KB each, 80 categories) registered for the run as ``synthetic_coco_train`` through
``DATASETS.COCO_JSONS``, instead of the config's ``DATASETS.TRAIN``. ``--max-seconds`` bounds
the run (counted from the start of ``main``, after the imports): each batch size gets an
equal share of the time left when it starts, no round starts that would not end within it
(rounds after the first timed one), and at the limit the round under way is dropped and the
figures so far are printed.

With ``SOLVER.IMS_PER_DEVICE`` 0 (one micro-batch per step) and ``SOLVER.LSR`` off, as in
the default config, both train the same model from the same first weights with SGD at the
same LR schedule; what differs is largedet's trainer loop, loader, optimizer builder and
hooks (each trainer's loader draws and flips its own images, so the batches differ). Trailing
``KEY VALUE`` pairs override the config (``MODEL.DEVICE cuda``, a smaller input for a dry
run).

    python benchmarks/trainer_overhead.py [--config FILE] [--rounds 4] [--iters 40]
        [--warmup-rounds 1] [--ims-per-batch B ...] [--coco-images N] [--max-seconds S]
        [--verbose] [KEY VALUE ...]

On one GPU, Faster R-CNN R50-FPN as Detectron2's model zoo trains it (``faster_rcnn_R_50_FPN_1x``:
scales 640-800, max 1333, flips, aspect-ratio grouping) with AMP (float16, gradient scaler)
at 2 and 4 images per step, 8 loader workers per trainer; random first weights (nothing is
downloaded) and an LR too small to move them (largedet refuses 0), so that the work per image
is the same in every round; the warm-up round also lets the gradient scaler find its scale.
At most ``--max-seconds`` after the imports::

    python benchmarks/trainer_overhead.py --config configs/r50_fpn_bs16_sgd.yaml \\
        --ims-per-batch 2 4 --coco-images 512 --rounds 6 --iters 25 --warmup-rounds 1 \\
        --max-seconds 130 MODEL.DEVICE cuda MODEL.WEIGHTS "" SOLVER.AMP.ENABLED True \\
        SOLVER.IMS_PER_DEVICE 0 SOLVER.BASE_LR 1e-12 SEED 0 DATALOADER.NUM_WORKERS 8

The last line of the output is ``GPU-CHECK-FIGURES {json}``, one line of JSON with the keys

    device, config, workers       the device's name, the config file, DATALOADER.NUM_WORKERS
    rounds, iters, warmup_rounds  the arguments
    amp                           SOLVER.AMP.ENABLED
    ims_per_batch                 the batch sizes asked for
    timed_out                     true where --max-seconds stopped a round or left one out
    wall_s                        seconds from the start of main to the figures
    ratio_min                     the lowest ratio of medians over the batch sizes measured
and per batch size B (the key ends in ``_b<B>``; absent where no round of B was timed):
    error_b<B>                    the exception that stopped B's rounds, in a line (only then;
                                  the traceback goes to stderr, the next B still runs, rc 1)
    rounds_b<B>                   timed rounds per trainer
    detectron2_images_per_s_b<B>  its median images/s over the rounds (wall clock)
    largedet_images_per_s_b<B>    the same for largedet
    detectron2_images_per_s_range_b<B>, largedet_images_per_s_range_b<B>  [min, max] over rounds
    ratio_b<B>                    largedet / Detectron2, the ratio of the medians
    round_ratio_median_b<B>       the median of the per-round ratios
    round_ratio_range_b<B>        their [min, max]
    cpu_ratio_b<B>                the ratio of the median CPU-s per step, Detectron2 / largedet
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

import torch
from detectron2.engine import DefaultTrainer
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import EventStorage

from largedet.config.validate import ConfigError
from largedet.engine import Trainer, largedet_argument_parser, setup_cfg
from synthetic_coco import INSTANCES_JSON, write_synthetic_coco
from time_guard import TimeGuard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
TRAINERS = {"detectron2": DefaultTrainer, "largedet": Trainer}
COCO_DATASET = "synthetic_coco_train"


class RoundRunner:
    """A trainer's training loop (``TrainerBase.train``) run a few steps at a time, each
    piece inside the trainer's own event storage."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.storage = EventStorage(trainer.start_iter)
        trainer.iter = trainer.start_iter
        with self.storage:
            trainer.storage = self.storage
            trainer.before_train()

    def run(self, steps: int) -> None:
        trainer = self.trainer
        with self.storage:
            for _ in range(steps):
                trainer.before_step()
                trainer.run_step()
                trainer.after_step()
                trainer.iter += 1

    def close(self) -> None:
        with self.storage:
            self.trainer.after_train()


def build_trainer(cls, args, opts: list, output_dir: str, max_iter: int):
    opts = list(args.opts) + opts + [
        "DATASETS.TEST", "()",
        "OUTPUT_DIR", output_dir,
        # two steps more than the rounds take: the checkpointers save neither at the last
        # step nor at the end of training (their after_train saves where iter + 1 >= MAX_ITER)
        "SOLVER.MAX_ITER", str(max_iter + 2),
        "SOLVER.CHECKPOINT_PERIOD", str(max_iter + 2),
    ]  # fmt: skip
    cfg_args = largedet_argument_parser().parse_args(["--config-file", args.config, *opts])
    cfg = setup_cfg(cfg_args, log=False)
    seed_all_rng(cfg.SEED)
    trainer = cls(cfg)
    trainer.resume_or_load(resume=False)
    return trainer


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Timings:
    """One batch size's timed rounds: per trainer, the wall-clock and CPU seconds per step
    of each round."""

    def __init__(self, ims_per_batch: int):
        self.ims_per_batch = ims_per_batch
        #: the exception that ended the batch size's rounds, in a line (None: none)
        self.error: str | None = None
        self.wall: dict[str, list[float]] = {name: [] for name in TRAINERS}
        self.cpu: dict[str, list[float]] = {name: [] for name in TRAINERS}

    @property
    def rounds(self) -> int:
        """Rounds timed for every trainer (a round dropped halfway counts for neither)."""
        return min(len(v) for v in self.wall.values())

    def images_per_s(self, name: str) -> list[float]:
        return [self.ims_per_batch / step for step in self.wall[name][: self.rounds]]

    def round_ratios(self) -> list[float]:
        """largedet / Detectron2 in images/s, round by round."""
        pairs = zip(self.images_per_s("largedet"), self.images_per_s("detectron2"))
        return [ours / ref for ours, ref in pairs]

    def figures(self) -> dict:
        b = f"_b{self.ims_per_batch}"
        out = {f"error{b}": self.error} if self.error else {}
        if not self.rounds:
            return out
        out[f"rounds{b}"] = self.rounds
        for name in TRAINERS:
            ips = self.images_per_s(name)
            out[f"{name}_images_per_s{b}"] = round(statistics.median(ips), 4)
            out[f"{name}_images_per_s_range{b}"] = [round(min(ips), 4), round(max(ips), 4)]
        ratios = self.round_ratios()
        median_ips = {name: statistics.median(self.images_per_s(name)) for name in TRAINERS}
        median_cpu = {name: statistics.median(self.cpu[name][: self.rounds]) for name in TRAINERS}
        out[f"ratio{b}"] = round(median_ips["largedet"] / median_ips["detectron2"], 4)
        out[f"round_ratio_median{b}"] = round(statistics.median(ratios), 4)
        out[f"round_ratio_range{b}"] = [round(min(ratios), 4), round(max(ratios), 4)]
        out[f"cpu_ratio{b}"] = round(median_cpu["detectron2"] / median_cpu["largedet"], 4)
        return out

    def report(self) -> None:
        error = f"; stopped by {self.error}" if self.error else ""
        print(f"IMS_PER_BATCH {self.ims_per_batch}: {self.rounds} timed round(s) per trainer{error}")
        if not self.rounds:
            return
        for name, cls in TRAINERS.items():
            wall, ips = self.wall[name][: self.rounds], self.images_per_s(name)
            print(
                f"  {name:<10} {cls.__module__}.{cls.__name__}: median "
                f"{statistics.median(wall):.4f} s/step, {statistics.median(ips):.2f} images/s "
                f"(rounds {min(ips):.2f}-{max(ips):.2f}), "
                f"{statistics.median(self.cpu[name][: self.rounds]):.4f} CPU-s/step"
            )
        f = self.figures()
        b = f"_b{self.ims_per_batch}"
        low, high = f[f"round_ratio_range{b}"]
        print(
            f"  largedet / detectron2 (images/s): {f[f'ratio{b}']:.3f} (medians), "
            f"{f[f'round_ratio_median{b}']:.3f} (median of per-round ratios, {low:.3f}-{high:.3f}), "
            f"{f[f'cpu_ratio{b}']:.3f} CPU time"
        )


def measure(args, opts: list, timings: Timings, tmp: str, share_end: float, end: float) -> bool:
    """Both trainers' alternating rounds at one batch size, into ``timings``. Returns False
    where a round was left out for the time (``share_end``: this batch size's end, on
    ``time.monotonic``; ``end``: the run's). A round starts only where one more round as
    long as the last ends by ``share_end`` (by ``end`` for the first timed round)."""
    total = (args.warmup_rounds + args.rounds) * args.iters
    folder = os.path.join(tmp, f"b{timings.ims_per_batch}")
    runners = {
        name: RoundRunner(build_trainer(cls, args, opts, os.path.join(folder, name), total))
        for name, cls in TRAINERS.items()
    }
    device = runners["largedet"].trainer.cfg.MODEL.DEVICE
    names, last_round = list(runners), 0.0
    for r in range(args.warmup_rounds + args.rounds):
        now = time.monotonic()
        timed = r >= args.warmup_rounds
        if now + last_round > (end if timed and not timings.rounds else share_end):
            return False
        for name in names if r % 2 == 0 else names[::-1]:
            sync(device)
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            runners[name].run(args.iters)
            sync(device)
            step_wall = (time.perf_counter() - start_wall) / args.iters
            step_cpu = (time.process_time() - start_cpu) / args.iters
            if timed:
                timings.wall[name].append(step_wall)
                timings.cpu[name].append(step_cpu)
            if args.verbose:
                print(
                    f"IMS_PER_BATCH {timings.ims_per_batch}, round {r}, {name}: {step_wall:.4f} s/step, "
                    f"{timings.ims_per_batch / step_wall:.2f} images/s, {step_cpu:.4f} CPU-s/step"
                )
        last_round = time.monotonic() - now
    for runner in runners.values():
        runner.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="a largedet yacs config")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per trainer")
    parser.add_argument("--iters", type=int, default=40, help="training steps per round")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first")
    parser.add_argument(
        "--ims-per-batch", type=int, nargs="+", default=None, metavar="B",
        help="SOLVER.IMS_PER_BATCH values measured one after the other (default: the config's)",
    )  # fmt: skip
    parser.add_argument(
        "--coco-images", type=int, default=0, metavar="N",
        help="train on N generated COCO-size JPEGs instead of DATASETS.TRAIN (0: the config's data)",
    )  # fmt: skip
    parser.add_argument(
        "--max-seconds", type=float, default=0.0,
        help="stop measuring after this many seconds and print the figures so far (0: no limit)",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="the trainers' logs, every round")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides")
    args = parser.parse_args()
    guard = TimeGuard(args.max_seconds)
    if not args.verbose:
        logging.disable(logging.INFO)  # the trainers set their loggers up themselves

    results: list[Timings] = []
    timed_out = False
    cfg = None
    with tempfile.TemporaryDirectory(prefix="trainer_overhead_") as tmp:
        opts = []
        with guard:
            try:
                data = os.path.join(tmp, "coco")
                if args.coco_images:
                    entry = [COCO_DATASET, os.path.join(data, INSTANCES_JSON), data]
                    opts += ["DATASETS.COCO_JSONS", json.dumps([entry])]
                    opts += ["DATASETS.TRAIN", f"('{COCO_DATASET}',)"]
                cfg_args = ["--config-file", args.config, *args.opts, *opts]
                cfg = setup_cfg(largedet_argument_parser().parse_args(cfg_args), log=False)
                if args.coco_images:  # once the config is known to be good
                    write_synthetic_coco(data, args.coco_images, jobs=min(len(os.sched_getaffinity(0)), 16))
                sizes = args.ims_per_batch or [cfg.SOLVER.IMS_PER_BATCH]
                for i, ims in enumerate(sizes):
                    timings = Timings(ims)
                    results.append(timings)
                    share_end = time.monotonic() + guard.left() / (len(sizes) - i)
                    batch_opts = opts + ["SOLVER.IMS_PER_BATCH", str(ims)]
                    try:
                        if not measure(args, batch_opts, timings, tmp, share_end, guard.end):
                            timed_out = True
                    except ConfigError:
                        raise
                    except Exception as e:  # the next batch size may still run: said, and rc 1
                        traceback.print_exc()
                        timings.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    gc.collect()  # this batch size's trainers, their loader workers and memory
                    if cfg.MODEL.DEVICE.startswith("cuda"):
                        torch.cuda.empty_cache()
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(2)
        report(args, cfg, results, timed_out or guard.expired, guard.elapsed())
    if any(t.error for t in results):
        sys.exit(1)


def report(args, cfg, results: list[Timings], timed_out: bool, wall_s: float) -> None:
    device = cfg.MODEL.DEVICE if cfg is not None else "?"
    where = torch.cuda.get_device_name() if device.startswith("cuda") else (platform.processor() or "cpu")
    overrides = f" {' '.join(args.opts)}" if args.opts else ""
    data = f"; {args.coco_images} COCO-size JPEGs" if args.coco_images else ""
    print(
        f"{os.path.relpath(args.config, ROOT)}{overrides}{data}: {args.rounds} rounds of {args.iters} "
        f"steps per trainer after {args.warmup_rounds} warm-up round(s), alternating; "
        f"{device} ({where}), torch {torch.__version__}, {torch.get_num_threads()} threads"
        + (f", {cfg.DATALOADER.NUM_WORKERS} loader workers" if cfg is not None else "")
        + ("; stopped by --max-seconds" if timed_out else "")
    )
    figures = {
        "device": where,
        "config": os.path.relpath(args.config, ROOT),
        "workers": cfg.DATALOADER.NUM_WORKERS if cfg is not None else None,
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup_rounds": args.warmup_rounds,
        "amp": bool(cfg.SOLVER.AMP.ENABLED) if cfg is not None else None,
        "ims_per_batch": [t.ims_per_batch for t in results],
        "timed_out": timed_out,
        "wall_s": round(wall_s, 1),
    }
    for timings in results:
        timings.report()
        figures.update(timings.figures())
    ratios = [figures[f"ratio_b{t.ims_per_batch}"] for t in results if t.rounds]
    figures["ratio_min"] = min(ratios) if ratios else None
    print("GPU-CHECK-FIGURES " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
