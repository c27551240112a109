"""Step time of Detectron2's ``DefaultTrainer`` against largedet's ``Trainer`` on one config.

Both trainers are built from the same config (by default the demo's
``configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``: Faster R-CNN R18-FPN, SGD, 8 images
per step, one loader worker), from the same seed, each with its own model, loader, optimizer
and hooks, and no evaluation (``DATASETS.TEST ()``, no checkpoint inside the run). They
train in alternating rounds of ``--iters`` steps, the order swapped every round, so that a
shared machine slows both alike. A round is Detectron2's training loop
(``TrainerBase.train``: hooks before and after each step, ``run_step``) for ``--iters``
steps; the trainers' ``before_train`` runs once before the first round. Prints each
trainer's median step time (wall clock and CPU time of this process, loader workers not
included) and largedet / Detectron2: the ratio of the medians and the median of the
per-round ratios.

With ``SOLVER.IMS_PER_DEVICE`` 0 (one micro-batch per step) and ``SOLVER.LSR`` off, as in
the default config, both train the same model from the same first weights with SGD at the
same LR schedule; what differs is largedet's trainer loop, loader, optimizer builder and
hooks (each trainer's loader draws and flips its own images, so the batches differ). Trailing
``KEY VALUE`` pairs override the config (``MODEL.DEVICE cuda``, a smaller input for a dry
run).

    python benchmarks/trainer_overhead.py [--config FILE] [--rounds 4] [--iters 40]
        [--warmup-rounds 1] [--verbose] [KEY VALUE ...]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
from detectron2.engine import DefaultTrainer
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import EventStorage

from largedet.config.validate import ConfigError
from largedet.engine import Trainer, largedet_argument_parser, setup_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
TRAINERS = {"detectron2": DefaultTrainer, "largedet": Trainer}


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


def build_trainer(cls, args, output_dir: str, max_iter: int):
    opts = list(args.opts) + [
        "DATASETS.TEST", "()",
        "OUTPUT_DIR", output_dir,
        # one step more than the rounds take: Detectron2's checkpointer saves at the last
        "SOLVER.MAX_ITER", str(max_iter + 1),
        "SOLVER.CHECKPOINT_PERIOD", str(max_iter + 1),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="a largedet yacs config")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per trainer")
    parser.add_argument("--iters", type=int, default=40, help="training steps per round")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--verbose", action="store_true", help="the trainers' logs, every round")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides")
    args = parser.parse_args()
    if not args.verbose:
        logging.disable(logging.INFO)  # the trainers set their loggers up themselves

    total = (args.warmup_rounds + args.rounds) * args.iters
    wall: dict[str, list[float]] = {name: [] for name in TRAINERS}
    cpu: dict[str, list[float]] = {name: [] for name in TRAINERS}
    with tempfile.TemporaryDirectory(prefix="trainer_overhead_") as tmp:
        try:
            runners = {
                name: RoundRunner(build_trainer(cls, args, os.path.join(tmp, name), total))
                for name, cls in TRAINERS.items()
            }
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        device = runners["largedet"].trainer.cfg.MODEL.DEVICE
        names = list(runners)
        for r in range(args.warmup_rounds + args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                sync(device)
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                runners[name].run(args.iters)
                sync(device)
                step_wall = (time.perf_counter() - start_wall) / args.iters
                step_cpu = (time.process_time() - start_cpu) / args.iters
                if r >= args.warmup_rounds:
                    wall[name].append(step_wall)
                    cpu[name].append(step_cpu)
                if args.verbose:
                    print(f"round {r} {name}: {step_wall:.4f} s/step, {step_cpu:.4f} CPU-s/step")
        for runner in runners.values():
            runner.close()

    where = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor()
    overrides = f" {' '.join(args.opts)}" if args.opts else ""
    print(
        f"{os.path.relpath(args.config, ROOT)}{overrides}: {args.rounds} rounds of {args.iters} "
        f"steps per trainer after {args.warmup_rounds} warm-up round(s), alternating; "
        f"{device} ({where or 'cpu'}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    for name, cls in TRAINERS.items():
        print(
            f"  {name:<10} {cls.__module__}.{cls.__name__}: median "
            f"{statistics.median(wall[name]):.4f} s/step (rounds {min(wall[name]):.4f}-"
            f"{max(wall[name]):.4f}), {statistics.median(cpu[name]):.4f} CPU-s/step"
        )
    paired = [ours / ref for ours, ref in zip(wall["largedet"], wall["detectron2"])]
    print(
        f"  largedet / detectron2: {statistics.median(wall['largedet']) / statistics.median(wall['detectron2']):.3f} "
        f"(medians), {statistics.median(paired):.3f} (median of per-round ratios, "
        f"{min(paired):.3f}-{max(paired):.3f}), "
        f"{statistics.median(cpu['largedet']) / statistics.median(cpu['detectron2']):.3f} CPU time"
    )


if __name__ == "__main__":
    main()
