"""The video trainer: largedet's trainer with video data, evaluation and multigrid."""

from __future__ import annotations

import logging
import os
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
from .stage_times import StageTimes, StageTimesHook, StepShapes, append_stage_times, format_stage_times, step_shapes

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
    its length in steps, precise BN at the base shape before each evaluation; a stage change
    is the sampler's next epoch and a regrouping of sub-batch BN, in place.

    The main process times each step by the shape of its batches, and precise BN and the
    evaluation, into ``stage_times.json`` (:mod:`largedet_video.engine.stage_times`)."""

    stage_times = None  # the main process's StageTimesHook
    multigrid_hook = None  # the MultigridHook of a multigrid run

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
            # Precise BN at the base shape before each evaluation, in place of Detectron2's.
            ret = [h for h in ret if not isinstance(h, hooks.PreciseBN)]
            lr_hook = next(i for i, h in enumerate(ret) if isinstance(h, hooks.LRScheduler))
            ret.insert(lr_hook + 1, self._multigrid_hook())
        if comm.is_main_process():
            # right after the timer: the other hooks' work after a step is not the step's
            self.stage_times = StageTimesHook(StageTimes(), self.shapes_of_iteration)
            ret.insert(1, self.stage_times)
        return ret

    def shapes_of_iteration(self, iteration: int) -> StepShapes:
        """The shapes of optimizer step ``iteration``'s batches: the multigrid plan's, or
        ``IMS_PER_DEVICE`` clips of ``INPUT.VIDEO.NUM_FRAMES`` x ``TRAIN_CROP_SIZE`` each."""
        if self.multigrid is None:
            v = self.cfg.INPUT.VIDEO
            batch = self.plan.batch
            return step_shapes([(batch.per_device, v.NUM_FRAMES, v.TRAIN_CROP_SIZE)] * batch.accumulation)
        batches = self.multigrid.shapes_of_iteration(iteration)
        return step_shapes([(s.batch_size, s.num_frames, s.crop_size) for s, _ in batches],
                           any(first for _, first in batches))  # fmt: skip

    def after_train(self):
        """largedet's, then (main process) this invocation's stage times appended to
        ``stage_times.json`` and logged."""
        super().after_train()
        if self.stage_times is None:
            return
        bn = self.multigrid_hook
        summary = self.stage_times.times.summary(
            self.stage_times.wall_s(),
            precise_bn_s=bn.precise_bn_s if bn else 0.0,
            precise_bn_passes=bn.precise_bn_passes if bn else 0,
            evaluation_s=self.evaluation.seconds,
        )
        if os.path.isdir(self.cfg.OUTPUT_DIR):
            append_stage_times(self.cfg.OUTPUT_DIR, summary)
        logger.info("Wall clock by stage:\n%s", format_stage_times(summary))

    def _base_shape_loader(self):
        """Training batches at the base shape for precise BN, without loader workers
        (as Detectron2's ``PreciseBN`` loader). Where the training loader decodes in this
        process (``DATALOADER.NUM_WORKERS`` 0) and keeps decoded videos
        (``INPUT.VIDEO.DECODED_CACHE_MB``), precise BN reads them from its cache: a cache
        changes no sample, and the pass then decodes none of the videos training has read
        (with a cache of its own it decoded every clip of its batches again)."""
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.DATALOADER.NUM_WORKERS = 0
        loader = build_video_train_loader(cfg, self.plan.batch.per_device)
        cache = getattr(self.data_loader.dataset, "cache", None)
        if self.cfg.DATALOADER.NUM_WORKERS == 0 and cache is not None:
            loader.dataset.cache = cache
        return loader

    def _multigrid_hook(self):
        # Precise BN at the base shape before every evaluation whatever TEST.PRECISE_BN.ENABLED
        # says: the running statistics of a multigrid run average every shape it trained on
        # (crops of 16, 23 and 32 px in one short cycle), and a model tested with them sees
        # the base shape's activations through another shape's statistics.
        self.multigrid_hook = MultigridHook(
            self.multigrid, self.model, self._base_shape_loader(), self.cfg.TEST.PRECISE_BN.NUM_ITER,
            self.cfg.TEST.EVAL_PERIOD,
        )
        return self.multigrid_hook
