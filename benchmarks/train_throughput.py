"""Training throughput (images/s) of Faster R-CNN R50-FPN: SGD vs PMD-LAMB, and gradient
accumulation K=1 vs K=8, at the same micro-batch.

The model is Detectron2's ``COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml`` as
``build_model`` makes it (FrozenBN, stem and res2 frozen), trained by largedet's
``AccumulationTrainer`` with optimizers from ``largedet.solver.build_optimizer``, on the
GPU when there is one, else the CPU. Inputs are fixed synthetic images (random pixels,
3-8 random boxes of 80 classes) already in memory, so data loading is not measured.
The LR is 0, so that the weights, and with them the proposals and the work per image,
stay the same in every run and round (the optimizers still do all their arithmetic).
Three runs share everything but the optimizer and K:

    sgd        SGD,      K = 1
    pmdlamb    PMD-LAMB, K = 1
    pmdlamb_k8 PMD-LAMB, K = 8 (one optimizer step per 8 micro-batches)

Each round gives every run 8 micro-batches (8 steps at K = 1, one step at K = 8); the
order of the runs rotates every round so that a noisy, shared machine affects all alike.
Prints the median images/s of each run (per wall-clock second and per CPU second, the
latter steadier on a shared machine) and the ratios PMD-LAMB / SGD and K=8 / K=1 (targets:
>= 0.97 each). With ``--amp`` on a GPU it also prints the per-GPU images/s next
to Detectron2's model-zoo figure for this model (0.210 s/iter for 16 images on 8 V100:
9.5 images/s per GPU, mixed precision off in that measurement's config).

Images are ``--image-size`` pixels high and ``--image-width`` wide (default: square);
COCO's are 800 high and up to 1333 wide after Detectron2's resize (800 x 1067 for the
usual 640 x 480 photo). ``--profile`` then runs one more round of the PMD-LAMB K=1 run
under ``torch.profiler`` and prints the three operators with the most self time on the
device (self CPU time too on a GPU, where the host can be the bottleneck). Trailing
``KEY VALUE`` pairs override the model's config (a smaller model for a dry run, say).

    python benchmarks/train_throughput.py [--rounds 5] [--ims-per-device 2] [--image-size 800]
        [--image-width 1067] [--device cuda|cpu] [--amp float16|bfloat16] [--profile]
        [KEY VALUE ...]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import platform
import statistics
import time
from typing import Dict, List, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

import largedet  # noqa: F401
from detectron2 import model_zoo
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage
from largedet.config import add_largedet_config
from largedet.config.safe_yaml import merge_config_file
from largedet.engine import AccumulationTrainer
from largedet.solver import build_optimizer

MICRO_BATCHES_PER_ROUND = 8
MODEL_ZOO_IMAGES_PER_S_PER_GPU = 16 / 0.210 / 8  # faster_rcnn_R_50_FPN_1x on 8 V100
RUNS = {"sgd": ("SGD", 1), "pmdlamb": ("PMD_LAMB", 1), "pmdlamb_k8": ("PMD_LAMB", 8)}


def synthetic_micro_batches(
    n: int, ims_per_device: int, height: int, width: int, seed: int = 0
) -> List[List[dict]]:
    g = torch.Generator().manual_seed(seed)
    size = torch.tensor([width, height], dtype=torch.float32)
    batches = []
    for _ in range(n):
        batch = []
        for _ in range(ims_per_device):
            k = int(torch.randint(3, 9, (1,), generator=g))
            xy = torch.rand(k, 2, generator=g) * size * 0.7
            wh = torch.rand(k, 2, generator=g) * size * 0.3 + 8
            inst = Instances((height, width))
            inst.gt_boxes = Boxes(torch.cat([xy, torch.minimum(xy + wh, size - 1)], dim=1))
            inst.gt_classes = torch.randint(0, 80, (k,), generator=g)
            image = torch.randint(0, 256, (3, height, width), generator=g, dtype=torch.uint8)
            batch.append({"image": image, "instances": inst, "height": height, "width": width})
        batches.append(batch)
    return batches


def build_run(
    optimizer_name: str, k: int, device: str, batches, amp_dtype, opts: List[str]
) -> AccumulationTrainer:
    cfg = add_largedet_config(get_cfg())
    merge_config_file(cfg, model_zoo.get_config_file("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"))
    cfg.merge_from_list(opts)
    cfg.MODEL.DEVICE = device
    cfg.MODEL.WEIGHTS = ""
    cfg.SOLVER.OPTIMIZER = optimizer_name
    # LR 0: the optimizers do all their work but the weights stay put. Faster R-CNN's cost
    # depends on its proposals (NMS, sampling), which move as the weights train; with LR 0
    # every run and round does the same work.
    cfg.SOLVER.BASE_LR = 0.0
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    return AccumulationTrainer(model, itertools.cycle(batches), optimizer, k, amp_dtype=amp_dtype)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_round(
    trainer: AccumulationTrainer, device: str, ims_per_device: int
) -> Tuple[float, float]:
    """images per wall-clock second and per CPU second (all threads) over one round of
    MICRO_BATCHES_PER_ROUND micro-batches."""
    steps = MICRO_BATCHES_PER_ROUND // trainer.accumulation_steps
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.run_step()
        trainer.iter += 1
        trainer.storage.iter = trainer.iter
    sync(device)
    images = MICRO_BATCHES_PER_ROUND * ims_per_device
    return images / (time.perf_counter() - wall), images / (time.process_time() - cpu)


def top_ops(prof, key: str, n: int = 3) -> Tuple[float, List[Tuple[str, float]]]:
    """The total and the ``n`` largest of the operators' self times ``key``
    ("self_cpu_time_total" or "self_device_time_total"), in ms. Operators are the events
    recorded on the host (aten ops, forward and backward); a kernel's device time counts
    for the operator that launched it."""
    ops = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU]
    if ops and not hasattr(ops[0], key):  # torch < 2.4 names device time after CUDA
        key = key.replace("device", "cuda")
    times = sorted(((e.key, getattr(e, key) / 1e3) for e in ops), key=lambda kv: -kv[1])
    return sum(t for _, t in times), times[:n]


def profile_round(trainer: AccumulationTrainer, device: str, ims_per_device: int) -> None:
    """One more round of ``trainer`` under torch.profiler; prints the top three operators by
    self device time (CUDA) and by self CPU time."""
    gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        time_round(trainer, device, ims_per_device)
    keys = (["self_device_time_total"] if gpu else []) + ["self_cpu_time_total"]
    for key in keys:
        total, top = top_ops(prof, key)
        where = "CUDA" if key == "self_device_time_total" else "CPU"
        print(
            f"  profile, one round (PMD-LAMB, K=1): top 3 operators by self {where} time "
            f"(of {total:.1f} ms):"
        )
        for rank, (name, ms) in enumerate(top, start=1):
            print(f"    {rank}. {name}  {ms:.1f} ms  {100 * ms / total:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--ims-per-device", type=int, default=2)
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image height (default: 800 on GPU, 320 on CPU)",
    )
    parser.add_argument(
        "--image-width", type=int, default=None, help="image width (default: --image-size)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", choices=["float16", "bfloat16"], default=None)
    parser.add_argument(
        "--profile", action="store_true", help="profile one more round; print the top 3 operators"
    )
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument(
        "opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides of the model's config"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    size = args.image_size or (800 if args.device.startswith("cuda") else 320)
    width = args.image_width or size
    amp_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, None: None}[args.amp]

    batches = synthetic_micro_batches(MICRO_BATCHES_PER_ROUND, args.ims_per_device, size, width)
    runs = {
        name: build_run(opt, k, args.device, batches, amp_dtype, args.opts)
        for name, (opt, k) in RUNS.items()
    }
    rates: Dict[str, List[float]] = {name: [] for name in runs}
    cpu_rates: Dict[str, List[float]] = {name: [] for name in runs}
    storages = {name: EventStorage(0) for name in runs}
    for name, trainer in runs.items():
        trainer.storage = storages[name]
    names = list(runs)
    for r in range(args.warmup_rounds + args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            with storages[name]:
                torch.manual_seed(r)  # the same proposal sampling for every run in a round
                rate, cpu_rate = time_round(runs[name], args.device, args.ims_per_device)
            if r >= args.warmup_rounds:
                rates[name].append(rate)
                cpu_rates[name].append(cpu_rate)
            if args.verbose:
                print(f"round {r} {name}: {rate:.3g} images/s, {cpu_rate:.3g} images per CPU-second")

    gpu = args.device.startswith("cuda")
    device_name = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    overrides = f" ({' '.join(args.opts)})" if args.opts else ""
    print(
        f"Faster R-CNN R50-FPN{overrides} training, {args.ims_per_device} images of "
        f"{width}x{size} (width x height) per pass, "
        f"{args.amp or 'fp32'}, {args.device} ({device_name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads); median of {args.rounds} rounds of "
        f"{MICRO_BATCHES_PER_ROUND} micro-batches"
    )
    median = {name: statistics.median(v) for name, v in rates.items()}
    cpu_median = {name: statistics.median(v) for name, v in cpu_rates.items()}
    for name, (opt, k) in RUNS.items():
        spread = f"{min(rates[name]):.3g}-{max(rates[name]):.3g}"
        print(
            f"  {name:<11} {opt:<9} K={k}  {median[name]:8.3g} images/s (rounds {spread}); "
            f"{cpu_median[name]:8.3g} images per CPU-second"
        )
    for label, a, b in (
        ("PMD-LAMB / SGD (K=1)", "pmdlamb", "sgd"),
        ("K=8 / K=1 (PMD-LAMB)", "pmdlamb_k8", "pmdlamb"),
    ):
        print(
            f"  {label}: {median[a] / median[b]:.3f} wall-clock, {cpu_median[a] / cpu_median[b]:.3f} "
            f"CPU time  (target >= 0.97)"
        )
    if gpu and args.amp:
        print(
            f"  per GPU with AMP: {median['pmdlamb_k8']:.1f} images/s (PMD-LAMB, K=8) vs Detectron2 "
            f"model zoo {MODEL_ZOO_IMAGES_PER_S_PER_GPU:.1f} images/s per V100"
        )
    if args.profile:
        with storages["pmdlamb"]:
            profile_round(runs["pmdlamb"], args.device, args.ims_per_device)


if __name__ == "__main__":
    main()
