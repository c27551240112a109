"""The video trainer: largedet's trainer with video data, evaluation and multigrid."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Optional

from detectron2.data import DatasetCatalog
from detectron2.engine import hooks
from detectron2.utils import comm
from largedet.engine import Trainer
from largedet.engine.parts import TrainerParts
from largedet.solver.batch import batch_plan
from largedet.solver.plan import RunPlan

from ..data import build_multigrid_train_loader, build_video_test_loader, build_video_train_loader
from ..data.build import MultigridTrainLoader
from ..evaluation import VideoClassificationEvaluator
from ..multigrid import MultigridPlan, build_multigrid_plan, multigrid_enabled
from .hooks import SkippedVideosHook
from .multigrid import MultigridHook, VideoRunPlan, build_multigrid_lr_scheduler, multigrid_run_plan

__all__ = ["VideoParts", "VideoRunPlan", "VideoTrainer"]

logger = logging.getLogger(__name__)


class VideoParts(TrainerParts):
    """largedet's parts of a yacs config (the trainer class's builders), whose run plan
    is a :class:`VideoRunPlan`: with multigrid it carries the multigrid plan of the training
    loader, built once with it (:func:`~largedet_video.data.build_multigrid_train_loader`),
    and its run length is the multigrid plan's steps; read by the LR schedule, the training
    loop and the hooks."""

    def build_run_plan(self, cfg, data_loader) -> VideoRunPlan:
        plan = super().build_run_plan(cfg, data_loader)
        if not isinstance(data_loader, MultigridTrainLoader):
            return VideoRunPlan(**{f.name: getattr(plan, f.name) for f in fields(plan)})
        return multigrid_run_plan(plan, cfg, data_loader.plan)


class VideoTrainer(Trainer):
    """largedet's trainer (global batch with accumulation, LSR + warmup, PMD-LAMB and
    the other optimizers, Sync-BN, DDP on GPUs or CPUs, W&B with ``WANDB.ENABLED``) with
    video data and evaluation.

    With ``MULTIGRID.LONG_CYCLE`` or ``SHORT_CYCLE`` it trains on the multigrid plan
    (``self.multigrid``, the run plan's): its loader, its LR through the one LR scheduler,
    its length in steps, precise BN at the base shape after each stage; a stage change is
    the sampler's next epoch and a regrouping of sub-batch BN, in place."""

    def __init__(self, cfg, parts: Optional[TrainerParts] = None):
        super().__init__(cfg, VideoParts(type(self)) if parts is None else parts)

    @property
    def multigrid(self) -> Optional[MultigridPlan]:
        """The multigrid plan the run trains on (None: no multigrid)."""
        return self.plan.multigrid

    @classmethod
    def build_train_loader(cls, cfg):
        if multigrid_enabled(cfg):
            return build_multigrid_train_loader(cfg)
        return build_video_train_loader(cfg, batch_plan(cfg, comm.get_world_size()).per_device)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer, plan: RunPlan, max_iter=None):
        """largedet's schedule, or the multigrid plan's over its steps (the plan's run length):
        the one ``plan`` carries (a :class:`VideoRunPlan`), else, for a caller with a plain
        run plan, one built from ``cfg`` and the training sets' sizes."""
        if not multigrid_enabled(cfg):
            return super().build_lr_scheduler(cfg, optimizer, plan, max_iter)
        if not isinstance(plan, VideoRunPlan) or plan.multigrid is None:
            num_samples = sum(len(DatasetCatalog.get(n)) for n in cfg.DATASETS.TRAIN)
            multigrid = build_multigrid_plan(cfg, num_samples, comm.get_world_size())
            plan = multigrid_run_plan(plan, cfg, multigrid)
        return build_multigrid_lr_scheduler(cfg, optimizer, plan)

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        return build_video_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        return VideoClassificationEvaluator(dataset_name)

    def build_hooks(self):
        ret = super().build_hooks()
        ret.insert(1, SkippedVideosHook(self.data_loader))
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
        return build_video_train_loader(cfg, self.plan.batch.per_device)

    def _multigrid_hook(self):
        # Precise BN at the base shape after every stage whatever TEST.PRECISE_BN.ENABLED
        # says: the running statistics of a multigrid run average every shape it trained on
        # (crops of 16, 23 and 32 px in one short cycle), and a model tested with them sees
        # the base shape's activations through another shape's statistics.
        return MultigridHook(
            self.multigrid, self.model, self._base_shape_loader(), self.cfg.TEST.PRECISE_BN.NUM_ITER
        )
