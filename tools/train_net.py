#!/usr/bin/env python3
"""Train or evaluate a detector with largedet.

    python tools/train_net.py --config configs/r50_fpn_bs1056.yaml --num-gpus 8
    torchrun --nproc_per_node 8 tools/train_net.py --config configs/r50_fpn_bs1056.yaml
    python tools/train_net.py --config configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml
    python tools/train_net.py --config CFG --eval-only MODEL.WEIGHTS output/model_final.pth
    python tools/train_net.py --config CFG --resume     # continue from OUTPUT_DIR/last_checkpoint

Trailing ``KEY VALUE`` pairs override the config. Several machines:
``--num-machines N --machine-rank R --dist-url tcp://HOST:PORT``. Without GPUs,
``--num-gpus N`` starts N CPU processes (gloo). The config is checked here, before any
process starts (``largedet.engine.check_args``, ``largedet.config.validate``): a missing file, an unknown key, a value of the
wrong type or out of range, an unregistered dataset, a global batch SOLVER.IMS_PER_BATCH that
is not a whole multiple of (processes x SOLVER.IMS_PER_DEVICE), the processes being torchrun's
or ``--num-gpus`` x ``--num-machines``, is one line on stderr; every error of the run is
reported at once, one line each, exit 2.
"""

from largedet.engine.train_net import main, run

__all__ = ["main"]

if __name__ == "__main__":
    run()
