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
(``largedet_video.engine.checks``): a missing file, an unknown key, a bad value, an
unregistered dataset or a global batch SOLVER.IMS_PER_BATCH that does not split into whole
micro-batches over the processes (torchrun's or ``--num-gpus`` x ``--num-machines``) is one
line on stderr, exit 2. Installed from the wheel, the same program is ``largedet-video-train``
(``largedet_video.engine.train_net``).
"""

from largedet_video.engine.train_net import main, run  # importing it registers the models

__all__ = ["main"]

if __name__ == "__main__":
    run()
