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
micro-batches over the processes is one line on stderr, exit 2.
"""

import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # largedet_video, uninstalled

import largedet_video  # noqa: E402,F401  (imports largedet first; registers the models)
from detectron2.checkpoint import DetectionCheckpointer  # noqa: E402
from detectron2.config import get_cfg  # noqa: E402
from detectron2.data import DatasetCatalog  # noqa: E402
from detectron2.engine import default_setup, default_writers, hooks  # noqa: E402
from detectron2.utils import comm  # noqa: E402
from detectron2.utils.logger import setup_logger  # noqa: E402
from largedet.engine import (  # noqa: E402
    Trainer as LargeBatchTrainer,
    batch_plan,
    largedet_argument_parser,
    resolve_device,
)
from largedet.engine.validate import ConfigError  # noqa: E402
from largedet.solver import lr_scaling  # noqa: E402

from largedet_video import add_video_config  # noqa: E402
from largedet_video.data import (  # noqa: E402
    build_multigrid_train_loader,
    build_video_test_loader,
    build_video_train_loader,
    register_video_datasets,
)
from largedet_video.engine import (  # noqa: E402
    MultigridHook,
    SkippedVideosHook,
    build_multigrid_lr_scheduler,
    launch,
)
from largedet_video.engine.validate import check_video_args  # noqa: E402
from largedet_video.multigrid import build_multigrid_plan, multigrid_enabled  # noqa: E402
from largedet_video.evaluation import VideoClassificationEvaluator  # noqa: E402

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "configs",
    "tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml",
)
logger = logging.getLogger("largedet_video")


class Trainer(LargeBatchTrainer):
    """largedet's trainer (global batch with accumulation, LSR + warmup, PMD-LAMB and
    the other optimizers, Sync-BN, DDP on GPUs or CPUs) with video data and evaluation.

    With ``MULTIGRID.LONG_CYCLE`` or ``SHORT_CYCLE`` it trains on the multigrid plan
    (``self.multigrid``): its loader, its LR through the one LR scheduler, its length
    in steps, precise BN at the base shape after each stage; a stage change is the
    sampler's next epoch and a regrouping of sub-batch BN, in place."""

    def __init__(self, cfg):
        self.multigrid = None
        if multigrid_enabled(cfg):
            num_samples = sum(len(DatasetCatalog.get(n)) for n in cfg.DATASETS.TRAIN)
            self.multigrid = build_multigrid_plan(cfg, num_samples, comm.get_world_size())
        super().__init__(cfg)
        if self.multigrid is not None:
            self.max_iter = self.multigrid.max_iter
            if comm.is_main_process():
                logger.info(self.multigrid.describe(lr_scaling(cfg).lr))

    @classmethod
    def build_train_loader(cls, cfg):
        if multigrid_enabled(cfg):
            return build_multigrid_train_loader(cfg)
        return build_video_train_loader(cfg, batch_plan(cfg, comm.get_world_size()).per_device)

    def build_lr_scheduler(self, cfg, optimizer):
        if self.multigrid is None:
            return super().build_lr_scheduler(cfg, optimizer)
        return build_multigrid_lr_scheduler(cfg, optimizer, self.multigrid)

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        return build_video_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        return VideoClassificationEvaluator(dataset_name)

    def build_hooks(self):
        ret = super().build_hooks()
        ret.insert(1, SkippedVideosHook(self._trainer.data_loader))
        if self.multigrid is not None:
            # Precise BN at stage ends, at the base shape, in place of Detectron2's.
            ret = [h for h in ret if not isinstance(h, hooks.PreciseBN)]
            lr_hook = next(i for i, h in enumerate(ret) if isinstance(h, hooks.LRScheduler))
            ret.insert(lr_hook + 1, self._multigrid_hook())
        return ret

    def _base_shape_loader(self):
        """Training batches at the base shape for precise BN, without loader workers
        (as Detectron2's ``PreciseBN`` loader)."""
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.DATALOADER.NUM_WORKERS = 0
        return build_video_train_loader(cfg, self.batch.per_device)

    def _multigrid_hook(self):
        precise_bn = self.cfg.TEST.PRECISE_BN
        return MultigridHook(
            self.multigrid,
            self.model,
            self._base_shape_loader() if precise_bn.ENABLED else None,
            precise_bn.NUM_ITER,
        )

    def build_writers(self):
        # Writers are built before the multigrid plan's length replaces MAX_ITER.
        max_iter = self.multigrid.max_iter if self.multigrid is not None else self.max_iter
        return default_writers(self.cfg.OUTPUT_DIR, max_iter)


def build_cfg(args):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.merge_from_file(args.config_file or DEFAULT_CONFIG)
    cfg.merge_from_list(args.opts)
    resolve_device(cfg)
    cfg.freeze()
    return cfg


def setup(args):
    cfg = build_cfg(args)
    default_setup(cfg, args)
    for name in ("largedet", "largedet_video"):
        setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name=name)
    if not args.config_file:
        logger.info("No --config-file given: running the built-in demo %s", DEFAULT_CONFIG)
    if cfg.CPU_THREADS and cfg.MODEL.DEVICE == "cpu":
        torch.set_num_threads(cfg.CPU_THREADS)
        logger.info("CPU_THREADS: %d torch thread(s) per process", cfg.CPU_THREADS)
    register_video_datasets(cfg)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        results = Trainer.test(cfg, model)
    else:
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()
    if comm.is_main_process():
        per_dataset = {cfg.DATASETS.TEST[0]: results} if "classification" in results else results
        for name, res in per_dataset.items():
            if "classification" in res:
                print(f"{name}: top-1 {res['classification']['top1']:.1f}%")
    return results


if __name__ == "__main__":
    args = largedet_argument_parser().parse_args()
    try:
        check_video_args(args, DEFAULT_CONFIG)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    launch(main, args)
