#!/usr/bin/env python3
"""Train or evaluate a video classifier (TSM, TSN, I3D) with largedet.

    python projects/video/train.py        # the built-in demo: TSM-R18 on generated videos, CPU
    python projects/video/train.py --num-gpus 8 \\
        --config-file projects/video/configs/kinetics400_tsm_r50_8f.yaml \\
        [--num-machines N --machine-rank R --dist-url tcp://HOST:PORT]
    torchrun --nproc_per_node 8 projects/video/train.py --config-file CFG
    python projects/video/train.py --config-file CFG --eval-only MODEL.WEIGHTS model_final.pth

Trailing ``KEY VALUE`` pairs override the config; ``--resume`` continues from the
last checkpoint in OUTPUT_DIR. Without a GPU, ``--num-gpus N`` starts N CPU
processes (gloo). The config is checked before any process starts
(``largedet_video.engine.validate``): a missing file, an unknown key, a bad value, an
unregistered dataset or a global batch SOLVER.IMS_PER_BATCH that does not split into whole
micro-batches over the processes (torchrun's or ``--num-gpus`` x ``--num-machines``) is one
line on stderr, exit 2.
"""

import largedet_video  # noqa: F401  (imports largedet first; registers the models)
from detectron2.utils import comm
from largedet.engine import check_and_launch, largedet_argument_parser, train_or_evaluate

from largedet_video.engine import VideoTrainer, setup
from largedet_video.engine.validate import check_video_args, video_output_dir


def main(args):
    cfg = setup(args)
    results = train_or_evaluate(VideoTrainer, cfg, args)
    if comm.is_main_process():
        per_dataset = {cfg.DATASETS.TEST[0]: results} if "classification" in results else results
        for name, res in per_dataset.items():
            if "classification" in res:
                print(f"{name}: top-1 {res['classification']['top1']:.1f}%")
    return results


if __name__ == "__main__":
    args = largedet_argument_parser().parse_args()
    check_and_launch(main, args, check_video_args, output_dir=video_output_dir)
