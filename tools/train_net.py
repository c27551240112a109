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
process starts (``largedet.engine.validate``): a missing file, an unknown key, a value of the
wrong type or out of range, an unregistered dataset, a global batch SOLVER.IMS_PER_BATCH that
is not a whole multiple of (processes x SOLVER.IMS_PER_DEVICE), the processes being torchrun's
or ``--num-gpus`` x ``--num-machines``, is one line on stderr, exit 2.
"""

import sys

import largedet  # noqa: F401  (makes Detectron2 usable where its compiled ops are missing)
from detectron2.utils import comm

from largedet.engine import Trainer, largedet_argument_parser, launch, setup_cfg, train_or_evaluate
from largedet.engine.validate import ConfigError, check_args


def main(args):
    cfg = setup_cfg(args)
    results = train_or_evaluate(Trainer, cfg, args)
    if comm.is_main_process():
        named = {"": results} if "bbox" in results else results
        for name, dataset_results in named.items():
            if isinstance(dataset_results, dict) and "bbox" in dataset_results:
                label = f" ({name})" if len(named) > 1 else ""
                print(f"box AP{label}: {dataset_results['bbox']['AP']:.1f}")
    return results


if __name__ == "__main__":
    args = largedet_argument_parser().parse_args()
    try:
        check_args(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    launch(main, args)
