#!/usr/bin/env python3
"""Train or evaluate a detector described by a LazyConfig (a Python config file) with largedet.

    python tools/lazyconfig_train_net.py --config configs/shapes/lazy/faster_rcnn_R18_FPN_pmdlamb_bs1024.py --num-gpus 8
    python tools/lazyconfig_train_net.py --config CFG.py train.ims_per_device=8 train.max_iter=100
    python tools/lazyconfig_train_net.py --config CFG.py --resume   # continue from train.output_dir
    python tools/lazyconfig_train_net.py --config CFG.py --eval-only train.init_checkpoint=model_final.pth

Trailing ``key=value`` pairs override the config (Detectron2's ``LazyConfig.apply_overrides``).
The trainer is largedet's, with the global batch ``train.ims_per_batch`` accumulated from
``train.ims_per_device``-image micro-batches, the LSR and warm-up of ``train.lsr`` and
``train.warmup``, and the config's optimizer (``largedet.engine.lazy`` describes the parts).
The batch arithmetic is checked here, before any process starts. Several machines:
``--num-machines N --machine-rank R --dist-url tcp://HOST:PORT``, or ``torchrun``, as
``tools/train_net.py``.
"""

from largedet.config.lazy import lazy_output_dir, lazy_timeout_s, run_config, setup_lazy_config
from largedet.engine import Trainer, check_and_launch, largedet_argument_parser, print_box_ap, train_or_evaluate
from largedet.engine.lazy import LazyParts, check_lazy_args
from largedet.launch.full_disk import set_up_log_files


def main(args):
    """One process's work, as ``tools/train_net.py``'s: ``train_or_evaluate`` with largedet's
    trainer and the LazyConfig's parts (``--eval-only`` reads ``train.init_checkpoint`` with
    largedet's checkpointer: ``.pkl`` weights without running code)."""
    cfg = setup_lazy_config(args, log_files=set_up_log_files)  # log.txt: plain text, stops on a full disk
    results = train_or_evaluate(Trainer, run_config(cfg), args, parts=LazyParts(cfg))
    print_box_ap(results)
    return results


if __name__ == "__main__":
    args = largedet_argument_parser().parse_args()
    # a ValueError: a config run_config rejects, or a batch that does not split
    check_and_launch(main, args, check_lazy_args, errors=(ValueError,), output_dir=lazy_output_dir,
                     timeout_s=lazy_timeout_s)  # fmt: skip
