"""``VideoTrainer``: Detectron2's ``DefaultTrainer`` for the video models.

It differs from ``DefaultTrainer`` in three places only:

- DDP is created with ``device_ids`` only for CUDA models, so several CPU
  processes (gloo) train too (``DefaultTrainer`` always passes a GPU index,
  which ``DistributedDataParallel`` rejects for CPU modules);
- a hook records the number of unreadable videos the loader skipped;
- the run's derived numbers (clips per device, epochs, LR, warmup) are logged
  once at the start.

The ``build_*`` class methods (model, optimizer, LR schedule, loaders,
evaluator) are Detectron2's until a subclass overrides them, as
``projects/video/train.py`` does.
"""

from __future__ import annotations

import logging
import weakref

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.engine import AMPTrainer, DefaultTrainer, SimpleTrainer, TrainerBase
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from torch.nn.parallel import DistributedDataParallel

from .hooks import SkippedVideosHook

__all__ = ["VideoTrainer", "create_ddp_model"]

logger = logging.getLogger(__name__)


def create_ddp_model(model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    """Wrap ``model`` in DDP when there are several processes; GPU models get
    their local device id, CPU models (gloo) none."""
    if comm.get_world_size() == 1:
        return model
    if next(model.parameters()).device.type == "cuda":
        kwargs.setdefault("device_ids", [comm.get_local_rank()])
    return DistributedDataParallel(model, **kwargs)


class VideoTrainer(DefaultTrainer):
    def __init__(self, cfg):
        TrainerBase.__init__(self)
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())

        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)

        model = create_ddp_model(model, broadcast_buffers=False)
        self._trainer = (AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer)(
            model, data_loader, optimizer
        )
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = DetectionCheckpointer(model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self))
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.cfg = cfg
        self.register_hooks(self.build_hooks())
        log_run_summary(cfg, data_loader, optimizer)

    def build_hooks(self):
        hooks = super().build_hooks()
        if hasattr(self._trainer.data_loader, "num_skipped"):
            hooks.insert(1, SkippedVideosHook(self._trainer.data_loader))  # after the timer
        return hooks

    def train(self):
        """Train; returns the last evaluation's results (``{}`` if none ran)."""
        super().train()
        return getattr(self, "_last_eval_results", None) or {}


def log_run_summary(cfg, data_loader, optimizer: torch.optim.Optimizer) -> None:
    """Log the numbers a run is defined by, derived from the config once."""
    world = comm.get_world_size()
    batch = cfg.SOLVER.IMS_PER_BATCH
    num_videos = len(getattr(data_loader, "dataset", ()))
    epochs = cfg.SOLVER.MAX_ITER * batch / num_videos if num_videos else float("nan")
    # The scheduler has already applied the warmup factor to "lr"; "initial_lr" is the base.
    lrs = sorted({g.get("initial_lr", g["lr"]) for g in optimizer.param_groups})
    logger.info(
        "Run: %d process(es) x %d clips = %d clips per step (SOLVER.IMS_PER_BATCH) on %s; "
        "%d iterations = %.1f epochs of %d training videos",
        world,
        batch // world,
        batch,
        cfg.MODEL.DEVICE,
        cfg.SOLVER.MAX_ITER,
        epochs,
        num_videos,
    )
    logger.info(
        "Optimizer %s: base LR %s (per param group), weight decay %g (norm %g, bias %s); "
        "%s schedule, linear warmup over %d iterations from factor %g",
        type(optimizer).__name__,
        ", ".join(f"{lr:g}" for lr in lrs),
        cfg.SOLVER.WEIGHT_DECAY,
        cfg.SOLVER.WEIGHT_DECAY_NORM,
        cfg.SOLVER.WEIGHT_DECAY_BIAS,
        cfg.SOLVER.LR_SCHEDULER_NAME,
        cfg.SOLVER.WARMUP_ITERS,
        cfg.SOLVER.WARMUP_FACTOR,
    )
    logger.info(
        "Clips: %d frames (%s sampling), %dpx training crops; test %d clips x %d crops of %dpx",
        cfg.INPUT.VIDEO.NUM_FRAMES,
        cfg.INPUT.VIDEO.SAMPLING,
        cfg.INPUT.VIDEO.TRAIN_CROP_SIZE,
        cfg.INPUT.VIDEO.TEST_NUM_CLIPS,
        cfg.INPUT.VIDEO.TEST_NUM_CROPS,
        cfg.INPUT.VIDEO.TEST_CROP_SIZE,
    )
