"""The GPU check's steps: each a repository script with its arguments on the GPU and on tiny
sizes on the CPU (the dry run), its time limit, the figures it must yield."""

from __future__ import annotations

from typing import Tuple

from .cuda_tests import parse_pytest, summarize_pytest
from .figures import parse_figures_line, summarize_figures
from .optimizer_step import parse_optimizer_step, summarize_optimizer_step
from .step import Step
from .train_throughput import parse_train_throughput, summarize_train_throughput
from .video import parse_multigrid, parse_video_throughput, summarize_multigrid, summarize_video_throughput

# The detector of the dry runs: largedet's narrow ResNet-10 (16-128 channels) under a
# 32-channel FPN, a 64-wide box head, instead of R50-FPN.
TINY_DETECTOR = (
    "MODEL.BACKBONE.NAME", "build_basic_resnet_fpn_backbone",
    "MODEL.RESNETS.DEPTH", "10",
    "MODEL.RESNETS.STEM_OUT_CHANNELS", "16",
    "MODEL.RESNETS.RES2_OUT_CHANNELS", "16",
    "MODEL.FPN.OUT_CHANNELS", "32",
    "MODEL.ROI_BOX_HEAD.FC_DIM", "64",
)  # fmt: skip

# The multigrid demo shrunk: 64 videos of 12 frames (48x32), 4 clips x 4 frames x 32^2 per
# step, 2 epochs (32 steps, LR step after epoch 1), ResNet-10 TSM at width 8, 1 test view.
TINY_MULTIGRID = (
    "DATASETS.MOVING_SHAPES.NUM_TRAIN", "64", "DATASETS.MOVING_SHAPES.NUM_VAL", "4",
    "DATASETS.MOVING_SHAPES.NUM_FRAMES", "12",
    "DATASETS.MOVING_SHAPES.WIDTH", "48", "DATASETS.MOVING_SHAPES.HEIGHT", "32",
    "MODEL.VIDEO.RESNET.DEPTH", "10", "MODEL.VIDEO.RESNET.WIDTH", "8",
    "INPUT.VIDEO.NUM_FRAMES", "4", "INPUT.VIDEO.TRAIN_CROP_SIZE", "32",
    "INPUT.VIDEO.TEST_SHORT_SIDE", "32", "INPUT.VIDEO.TEST_CROP_SIZE", "32",
    "INPUT.VIDEO.TEST_NUM_CLIPS", "1", "INPUT.VIDEO.TEST_NUM_CROPS", "1",
    "DATALOADER.NUM_WORKERS", "0",
    "SOLVER.IMS_PER_BATCH", "4", "SOLVER.STEPS", "(16,)", "SOLVER.MAX_ITER", "32",
    "SOLVER.WARMUP_ITERS", "0", "SOLVER.CHECKPOINT_PERIOD", "1000",
    "TEST.PRECISE_BN.NUM_ITER", "1", "MULTIGRID.BN_BASE_SIZE", "2",
)  # fmt: skip


def _train_throughput_step(amp: str, short: str) -> Step:
    return Step(
        name=f"train-throughput-{short}",
        what=f"R50-FPN training images/s, AMP {amp}, SGD vs PMD-LAMB, K=1 vs K=8, profiled",
        gpu_args=(
            "benchmarks/train_throughput.py", "--device", "cuda", "--amp", amp,
            "--ims-per-device", "2", "--image-size", "800", "--image-width", "1067",
            "--rounds", "10", "--warmup-rounds", "2", "--profile",
        ),
        dry_args=(
            "benchmarks/train_throughput.py", "--device", "cpu", "--amp", amp,
            "--ims-per-device", "1", "--image-size", "32", "--rounds", "1",
            "--warmup-rounds", "0", "--profile", *TINY_DETECTOR,
        ),
        timeout_s=300,
        parse=parse_train_throughput,
        summarize=summarize_train_throughput,
        required=("images_per_s", "pmdlamb_vs_sgd", "k8_vs_k1", "profile_top3_cpu"),
        required_on_gpu=("per_gpu_images_per_s", "profile_top3_cuda"),
    )  # fmt: skip


STEPS: Tuple[Step, ...] = (
    Step(
        name="cuda-tests",
        what="the CUDA tests (pytest -m cuda tests/cuda)",
        gpu_args=(
            "-m", "pytest", "-m", "cuda", "tests/cuda", "-v", "-p", "no:cacheprovider",
            "--junitxml", "{out}/cuda-tests.xml",
        ),
        dry_args=(
            "-m", "pytest", "-m", "cuda", "tests/cuda", "-v", "-p", "no:cacheprovider",
            "--junitxml", "{out}/cuda-tests.xml",
        ),
        timeout_s=360,
        parse=parse_pytest,
        summarize=summarize_pytest,
        required=("passed", "failed", "skipped"),
    ),
    Step(
        name="video-shift",
        what="TSM's shift against TSN per shift implementation, R50 8x8x224^2, fp32 and bf16",
        gpu_args=(
            "projects/video/benchmarks/shift_cost.py", "--device", "cuda", "--amp", "none",
            "bf16", "--rounds", "16", "--steps", "10", "--max-seconds", "70",
        ),
        dry_args=(
            "projects/video/benchmarks/shift_cost.py", "--device", "cpu", "--depth", "10",
            "--width", "8", "--size", "32", "--batch", "2", "--steps", "1", "--rounds", "1",
            "--warmup", "1", "--shift-reps", "1",
        ),
        timeout_s=110,
        parse=parse_figures_line,
        summarize=summarize_figures(("ratio", "ratio_range", "shift_ms", "exact", "errors")),
        required=("ratio", "step_ms", "exact"),
    ),
    Step(
        name="trainer-vs-detectron2",
        what="largedet's Trainer against Detectron2's DefaultTrainer, R50-FPN, AMP, 2 and 4 images",
        gpu_args=(
            "benchmarks/trainer_overhead.py", "--config", "configs/r50_fpn_bs16_sgd.yaml",
            "--ims-per-batch", "2", "4", "--coco-images", "512", "--rounds", "6", "--iters", "25",
            "--warmup-rounds", "1", "--max-seconds", "120", "MODEL.DEVICE", "cuda",
            "MODEL.WEIGHTS", "", "SOLVER.AMP.ENABLED", "True", "SOLVER.IMS_PER_DEVICE", "0",
            "SOLVER.BASE_LR", "1e-12", "SEED", "0", "DATALOADER.NUM_WORKERS", "8",
        ),
        dry_args=(
            "benchmarks/trainer_overhead.py", "--config", "configs/r50_fpn_bs16_sgd.yaml",
            "--ims-per-batch", "1", "2", "--coco-images", "4", "--rounds", "1", "--iters", "1",
            "--warmup-rounds", "0", "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "",
            "SOLVER.IMS_PER_DEVICE", "0", "SEED", "0", "DATALOADER.NUM_WORKERS", "0",
            "INPUT.MIN_SIZE_TRAIN", "(32,)", "INPUT.MAX_SIZE_TRAIN", "48", *TINY_DETECTOR,
        ),
        timeout_s=160,
        parse=parse_figures_line,
        summarize=summarize_figures(
            ("largedet_images_per_s_b2", "detectron2_images_per_s_b2", "ratio_b2",
             "round_ratio_range_b2", "largedet_images_per_s_b4", "detectron2_images_per_s_b4",
             "ratio_b4", "round_ratio_range_b4")
        ),
        required=("ratio_min",),
    ),
    Step(
        name="loader-speed",
        what="Detectron2's training loader alone on the machine's cores, COCO-size JPEGs",
        gpu_args=(
            "benchmarks/loader_speed.py", "--images", "512", "--workers", "1", "2", "4", "8",
            "16", "--images-per-worker", "150", "--single-images", "64",
            "--train-images-per-s", "40", "--max-seconds", "45",
        ),
        dry_args=(
            "benchmarks/loader_speed.py", "--images", "6", "--workers", "0", "1",
            "--ims-per-batch", "2", "--images-per-worker", "3", "--warmup-images-per-worker",
            "2", "--single-images", "3", "--train-images-per-s", "2.5",
            "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
        ),
        timeout_s=90,
        parse=parse_figures_line,
        summarize=summarize_figures(
            ("mapper_ms", "decode_share", "augment_share", "images_per_s_w1", "images_per_s_w8",
             "images_per_s_w16", "workers_per_gpu", "cpu_cores_per_gpu")
        ),
        required=("mapper_ms", "workers_per_gpu"),
    ),
    Step(
        name="multigrid-r50",
        what="multigrid's speed-up at equal epochs from step times, TSM-R50 at 8x224^2",
        gpu_args=(
            "projects/video/benchmarks/multigrid_speed.py", "--device", "cuda", "--plain-bn-too",
            "--rounds", "12", "--steps", "5", "--max-seconds", "60",
        ),
        dry_args=(
            "projects/video/benchmarks/multigrid_speed.py", "--device", "cpu", "--plain-bn-too",
            "--steps", "1", "--warmup", "1", "--rounds", "1",
            "MODEL.VIDEO.RESNET.DEPTH", "10", "MODEL.VIDEO.RESNET.WIDTH", "8",
            "INPUT.VIDEO.TRAIN_CROP_SIZE", "32", "SOLVER.IMS_PER_DEVICE", "2",
            "MULTIGRID.BN_BASE_SIZE", "2",
        ),
        timeout_s=100,
        parse=parse_figures_line,
        summarize=summarize_figures(("speedup", "speedup_plain_bn", "batch_ratio",
                                     "subbatch_bn_cost", "errors")),
        required=("speedup", "batch_ratio", "shapes"),
    ),
    Step(
        name="optimizer-step",
        what="one optimizer step on R50-FPN's parameters",
        gpu_args=(
            "benchmarks/optimizer_step.py", "--device", "cuda", "--rounds", "50", "--warmup", "5",
            "--profile",
        ),
        dry_args=(
            "benchmarks/optimizer_step.py", "--device", "cpu", "--rounds", "1", "--warmup", "0",
            "--profile", *TINY_DETECTOR,
        ),
        timeout_s=180,
        parse=parse_optimizer_step,
        summarize=summarize_optimizer_step,
        required=("step_ms", "profile"),
        required_on_gpu=("pmd_lamb_vs_fused_adamw",),
    ),
    _train_throughput_step("bfloat16", "bf16"),
    _train_throughput_step("float16", "fp16"),
    Step(
        name="video-throughput",
        what="TSM vs TSN vs I3D-R50 training clips/s, 8x224^2, batch 8",
        gpu_args=(
            "projects/video/benchmarks/throughput.py", "--device", "cuda", "--decode-seconds", "2",
        ),
        dry_args=(
            "projects/video/benchmarks/throughput.py", "--device", "cpu", "--depth", "50",
            "--width", "8", "--size", "32", "--frames", "4", "--batch", "2", "--steps", "1", "--rounds", "1",
            "--warmup", "0", "--skip-decode",
        ),
        timeout_s=420,
        parse=parse_video_throughput,
        summarize=summarize_video_throughput,
        required=("clips_per_s", "tsm_vs_i3d_3x3x3", "tsm_vs_i3d_3x1x1", "shift_cost_pct"),
    ),
    Step(
        name="multigrid",
        what="multigrid vs the base shape, the video demo on the GPU",
        gpu_args=(
            "projects/video/benchmarks/multigrid.py", "--epoch-factors", "1.5", "1.0",
            "--output", "{out}/multigrid", "MODEL.DEVICE", "cuda",
            "DATALOADER.NUM_WORKERS", "8", "DATASETS.MOVING_SHAPES.ROOT", "{out}/datasets",
        ),
        dry_args=(
            "projects/video/benchmarks/multigrid.py", "--epoch-factors", "1.5", "1.0",
            "--output", "{out}/multigrid", "MODEL.DEVICE", "cpu",
            "DATASETS.MOVING_SHAPES.ROOT", "{out}/datasets", *TINY_MULTIGRID,
        ),
        timeout_s=480,
        parse=parse_multigrid,
        summarize=summarize_multigrid,
        required=("runs", "speedup", "top1_diff"),
    ),
)  # fmt: skip
STEP_NAMES = tuple(step.name for step in STEPS)
