"""largedet's detection trainer: Detectron2's ``DefaultTrainer`` for very large global batches.

The trainer builds and connects; each part it connects lives in its own room:

- what the run is built from (:mod:`largedet.engine.parts`): the model, the training
  loader, the run plan, the optimizer, the LR schedule and the evaluation, from a yacs
  config or a LazyConfig (:mod:`largedet.engine.lazy`), into the same trainer;
- the run plan (:class:`~largedet.solver.plan.RunPlan`): every derived number (global
  batch, devices, micro-batch, K, the batch ramp, the scaled LR, the warm-up, the
  clipping), built once and handed to the builders, the loop, the hooks and the log block
  (:meth:`~largedet.solver.plan.RunPlan.describe`);
- the loop of one optimizer step (:class:`~largedet.engine.train_loop.AccumulationTrainer`):
  K micro-batches with DDP's ``no_sync``, AMP, clipping, AGVM's estimates;
- the optimizer and LR schedule (:mod:`largedet.solver`), "SyncBN" on any device
  (:mod:`largedet.layers`), the resumable data stream and its position
  (:mod:`largedet.data`, :class:`~largedet.data.position.DataPosition`), atomic checkpoints
  (:mod:`largedet.checkpoint`);
- the hooks in their order (:mod:`largedet.engine.hook_list`, with the evaluation they
  run): the divergence guard and its rollback, per-step seeding, model EMA
  (:mod:`largedet.engine.hooks`, :mod:`largedet.engine.ema`), pre-emption and the run
  summary with how each invocation ended (:mod:`largedet.launch`).

With ``IMS_PER_DEVICE`` 0 (one micro-batch per step) and the LSR off it trains as
``DefaultTrainer`` does.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Optional

from detectron2.engine import DefaultTrainer, TrainerBase, create_ddp_model
from detectron2.evaluation import verify_results
from detectron2.modeling import build_model
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventStorage
from detectron2.utils.logger import setup_logger

from ..checkpoint import AtomicCheckpointer, FoundCheckpoint, warn_if_low_space
from ..config import amp_dtype
from ..config.validate import check_values, warn_unused_lsr_keys
from ..data.build import ResumableLoader, build_test_loader, build_train_loader
from ..data.position import DataPosition
from ..evaluation.registry import build_evaluator
from ..launch.processes import shut_down_distributed_at_exit
from ..launch.run_summary import RunEnd, run_after_train_hooks
from ..layers import resolve_sync_batchnorm
from ..solver import build_agvm, build_lr_scheduler, build_optimizer, describe_agvm_parts, with_scaled_lr
from ..solver.batch import batch_plan
from ..solver.plan import RunPlan
from .ema import Evaluation, ModelEMA
from .hook_list import default_hooks
from .hooks import StepRolledBack
from .parts import TrainerParts
from .train_loop import AccumulationTrainer
from .writers import (
    ImageClockPrinter,
    build_wandb_writers,
    drop_logged_steps,
    forget_steps_from,
    default_writers_stopping_on_full_disk,
    raise_if_a_log_found_no_space,
)

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


class Trainer(TrainerBase):
    """Trains and evaluates a Detectron2 model with largedet's batch arithmetic, optimizers,
    LR rule, Sync-BN, checkpoints and hooks. Used as ``DefaultTrainer``::

        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()

    ``parts`` (:mod:`largedet.engine.parts`) builds the model, the training loader, the run
    plan, the optimizer, the LR schedule and the evaluation: by default this class's
    builder classmethods (:class:`~largedet.engine.parts.TrainerParts`: a subclass's
    ``build_model`` is used), a LazyConfig's :class:`~largedet.engine.lazy.LazyParts`.

    The contract: a Detectron2 ``TrainerBase`` (hooks, ``iter``, ``storage``) with
    ``DefaultTrainer``'s interface, not its subclass (``DefaultTrainer`` fixes its inner
    trainer, checkpointer, length and loop, which largedet changes). Kept: the builder
    classmethods with Detectron2's parameters (``build_optimizer`` and ``build_lr_scheduler``
    also take the run plan), ``test``, ``resume_or_load``, ``build_hooks``,
    ``build_writers``, ``model``, ``optimizer``, ``data_loader`` and the state dict's
    ``_trainer`` entry. Added, as attributes: the parts (:attr:`parts`), the run plan
    (:attr:`plan`), the inner loop (:attr:`loop`, an
    :class:`~largedet.engine.train_loop.AccumulationTrainer` driven one
    :class:`~largedet.solver.plan.StepPlan` per step: the last step's losses, gradient norm,
    gradient scaler, AGVM and stop request are its), the data position (:attr:`data`), the
    evaluation (:attr:`evaluation`), how the run ended (:attr:`run_end`); and the rollback
    (:meth:`roll_back`).
    """

    # the inner loop's, as DefaultTrainer exposes them
    model = property(lambda self: self.loop.model)
    optimizer = property(lambda self: self.loop.optimizer)
    data_loader = property(lambda self: self.loop.data_loader)

    def __init__(self, cfg, parts: Optional[TrainerParts] = None):
        super().__init__()
        for name in ("detectron2", "largedet"):
            if not logging.getLogger(name).isEnabledFor(logging.INFO):
                setup_logger(name=name)
        #: what the run is built from (:mod:`largedet.engine.parts`)
        self.parts = TrainerParts(type(self)) if parts is None else parts
        # each key's declared rule (largedet.config.keys), as checked before launch, for a
        # config that did not come through a training script
        check_values(cfg, self.parts.value_rules)

        model = self.parts.build_model(cfg)
        data_loader = self.parts.build_train_loader(cfg)
        if not isinstance(data_loader, ResumableLoader):
            logger.warning(
                "The training loader is not a ResumableLoader: its position is not restored on resume"
            )
        #: the run's derived numbers, computed once (:func:`~largedet.solver.plan.run_plan`)
        self.plan: RunPlan = self.parts.build_run_plan(cfg, data_loader)
        optimizer = self.parts.build_optimizer(cfg, model, self.plan)
        agvm = build_agvm(cfg, optimizer)

        cpu = next(model.parameters()).device.type != "cuda"
        model = create_ddp_model(
            model, broadcast_buffers=False, **({"device_ids": None} if cpu else {})
        )
        #: the loop of one optimizer step: K micro-batches, AMP, clipping, AGVM, the stop request
        self.loop = AccumulationTrainer(
            model,
            data_loader,
            optimizer,
            self.plan.batch.accumulation,
            amp_dtype=amp_dtype(cfg),
            agvm=agvm,
            parameter_clip=self.plan.parameter_clip,
        )
        #: where the training loop stops: the plan's run length
        self.max_iter = self.plan.run_length
        self.scheduler = self.parts.build_lr_scheduler(cfg, optimizer, self.plan, self.max_iter)
        self.ema: Optional[ModelEMA] = ModelEMA.from_config(cfg, model)
        extra = {} if self.ema is None else {"model_ema": self.ema}
        self.checkpointer = AtomicCheckpointer(
            model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self), **extra
        )
        self.start_iter = 0
        self.cfg = cfg
        #: the images of the global stream trained on, and the stream's seed
        self.data = DataPosition(data_loader, self.plan.batch)
        #: the evaluation hook's test, its wall-clock and last results
        self.evaluation = Evaluation(self.parts.test, cfg, model, self.ema)
        #: how this invocation ended (:class:`~largedet.launch.run_summary.RunEnd`), for the run summary
        self.run_end = RunEnd()
        self.register_hooks(self.build_hooks())
        if comm.is_main_process():
            block = self.plan.describe(cfg, type(optimizer).__name__, describe_agvm_parts(optimizer, agvm))
            if os.path.isdir(cfg.OUTPUT_DIR):  # weights and up to two moments per weight
                weights_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
                warn_if_low_space(cfg.OUTPUT_DIR, 3 * weights_bytes, "a checkpoint")
            if self.ema is not None:
                block += f"\n  {self.ema.describe(self.plan.batch.global_batch)}; evaluation on {cfg.MODEL_EMA.EVAL!r}"
            logger.info(block)
            warn_unused_lsr_keys(cfg)

    # --- builders (a yacs config's: TrainerParts calls them) ----------------------------

    @classmethod
    def build_model(cls, cfg):
        """Detectron2's ``build_model``, with "SyncBN" layers made runnable on ``MODEL.DEVICE``."""
        model = resolve_sync_batchnorm(build_model(cfg), cfg.MODEL.DEVICE)
        logger.info("Model:\n%s", model)
        return model

    @classmethod
    def build_optimizer(cls, cfg, model, plan: RunPlan):
        """``largedet.solver.build_optimizer`` (``SOLVER.OPTIMIZER``) at the peak LR of the run
        plan ``plan``. Gradients are clipped by the training loop, not by a wrapper."""
        return build_optimizer(with_scaled_lr(cfg, plan.lr), model, accumulates=True)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer, plan: RunPlan, max_iter: Optional[int] = None):
        """Detectron2's warmup + schedule around the run plan's peak LR
        (``largedet.solver.build_lr_scheduler``) over ``max_iter`` steps (default the plan's
        ``SOLVER.MAX_ITER``; the trainer passes the plan's
        :attr:`~largedet.solver.plan.RunPlan.run_length`). With a batch ramp
        (``SOLVER.BATCH_RAMP``) the LR follows the plan's images and batches."""
        return build_lr_scheduler(cfg, optimizer, plan, max_iter)

    @classmethod
    def build_train_loader(cls, cfg):
        """Detectron2's training loader with ``IMS_PER_DEVICE`` images per batch, resumable."""
        return build_train_loader(cfg, batch_plan(cfg, comm.get_world_size()).per_device)

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        """Evaluate ``model`` on each of ``cfg.DATASETS.TEST``: Detectron2's
        ``DefaultTrainer.test``, with this class's :meth:`build_test_loader` and
        :meth:`build_evaluator`."""
        return DefaultTrainer.test.__func__(cls, cfg, model, evaluators)

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        """Detectron2's test loader, with unreadable images logged, counted and left out."""
        return build_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        """The evaluator that the dataset's ``evaluator_type`` names in
        :data:`~largedet.evaluation.EVALUATOR_REGISTRY` (COCO, Open Images, a user's)."""
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference")
        return build_evaluator(cfg, dataset_name, output_folder)

    def build_hooks(self):
        """The run's hooks in their order: :func:`~largedet.engine.hook_list.default_hooks`
        (Detectron2's, the divergence guard, seeding, model EMA, pre-emption, ``HOOKS``, the
        run summary)."""
        return default_hooks(self)

    def build_writers(self):
        """Detectron2's writers (console with the ETA, ``metrics.json``, TensorBoard) over
        the run's ``max_iter`` steps, and W&B's with ``WANDB.ENABLED``. With a batch ramp the
        console's ETA counts images, not steps (:class:`~largedet.engine.writers.ImageClockPrinter`).
        The file writers stop the run with one :class:`~largedet.checkpoint.DiskFullError` on
        a full disk (:func:`~largedet.engine.writers.default_writers_stopping_on_full_disk`)."""
        writers = default_writers_stopping_on_full_disk(self.cfg.OUTPUT_DIR, self.max_iter)
        schedule = self.plan.schedule
        if schedule.ramped and schedule.total_steps == self.max_iter:
            writers = [ImageClockPrinter(schedule) if isinstance(w, CommonMetricPrinter) else w
                       for w in writers]  # fmt: skip
        return writers + build_wandb_writers(self.cfg)

    # --- the run -------------------------------------------------------------------------

    def resume_or_load(self, resume=True):
        """``DefaultTrainer.resume_or_load`` with :class:`AtomicCheckpointer`'s resume: from
        the newest checkpoint in ``OUTPUT_DIR`` that loads completely, tagged or not; never
        from scratch when checkpoints exist but none loads (an error says why)."""
        self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        if self.checkpointer.resumed_from:
            # the checkpoint holds the iteration that had just finished
            self.start_iter = self.iter + 1
        if resume:  # the steps trained after the checkpoint are trained again: logged once
            drop_logged_steps(self._hooks, self.start_iter)

    def run_step(self):
        """One optimizer step of the plan's (:meth:`~largedet.solver.plan.RunPlan.step_at`: its
        K, total-norm clip and, with a batch ramp, PMD's clock): the backward passes, the
        hooks' ``after_backward``, the optimizer step; then the data position moves on."""
        self.loop.set_step(self.iter, self.plan.step_at(self.iter))
        gradients = self.loop.backward()
        self.after_backward()
        self.loop.step_optimizer(gradients)
        self.data.advance(self.plan.batch_at(self.iter))

    def train(self):
        """Train, then return the last evaluation results (``{}`` when none ran).

        The loop of Detectron2's ``TrainerBase.train``, except that it follows
        :attr:`iter` when a rollback (:meth:`roll_back`) sends it back: training goes on
        from the iteration after the restored one, until ``max_iter``. The data loader's
        iterator is made before the hooks' ``before_train``
        (:meth:`~largedet.engine.train_loop.AccumulationTrainer.start_data_stream`). How the
        loop ended is :attr:`run_end`'s (:class:`~largedet.launch.run_summary.RunEnd`). A
        distributed run that ended without an error shuts the process group down at exit.
        """
        loop_logger = logging.getLogger("detectron2.engine.train_loop")  # its messages as before
        loop_logger.info("Starting training from iteration %d", self.start_iter)
        self.iter = self.start_iter
        self.run_end.start()
        with EventStorage(self.start_iter) as self.storage:
            try:
                self.loop.start_data_stream()
                self.before_train()
                while self.iter < self.max_iter:
                    self.before_step()
                    self.run_step()
                    self.after_step()
                    self.iter += 1
                self.run_end.finish()
            except BaseException as error:
                distributed = comm.get_world_size() > 1
                raised = self.run_end.record(error, self.iter, self.cfg.OUTPUT_DIR, distributed, loop_logger)
                if raised is error:
                    raise
                raise raised from None
            finally:
                self.after_train()
        if comm.get_world_size() > 1:
            shut_down_distributed_at_exit()
        results = self.evaluation.last_results
        if len(self.cfg.TEST.EXPECTED_RESULTS) and comm.is_main_process():
            assert results is not None, "No evaluation results during training!"
            verify_results(self.cfg, results)
        return results or {}

    def after_step(self):
        """Every hook's ``after_step`` in order, until one rolls the step back
        (:class:`~largedet.engine.hooks.StepRolledBack`, raised after :meth:`roll_back`): the
        later hooks would act on a step that was undone (save, evaluate, step the LR,
        write), so they do not run for it, and a line names them. Then a log file that found
        no space during the step stops the run
        (:func:`~largedet.launch.full_disk.raise_if_a_log_found_no_space`)."""
        for i, hook in enumerate(self._hooks):
            try:
                hook.after_step()
            except StepRolledBack as undone:
                later = ", ".join(type(h).__name__ for h in self._hooks[i + 1 :]) or "none"
                logger.warning("%s; after_step not run for the undone step by: %s", undone, later)
                forget_steps_from(self.storage, self._hooks, self.iter + 1)
                break
        raise_if_a_log_found_no_space()

    def after_train(self):
        """Every hook's ``after_train`` in order, as Detectron2's, except that a pre-emption
        during the final evaluation (:class:`~largedet.launch.preemption.Preempted`) or a full disk
        (:class:`~largedet.checkpoint.DiskFullError`) in one hook lets the later ones run
        (the last metrics, ``run_summary.json`` with how the run ended) before it is
        raised. After a run that stopped on an error, another hook's error is logged in one
        line and the later hooks still run. After a lost process of the job
        (:class:`~largedet.launch.elastic.LostProcessError`) the evaluation and checkpoint
        hooks do not run: they would wait on the broken process group, or save a step that
        did not finish. The pre-emption handlers are put back at the end."""
        self.storage.iter = self.iter
        run_after_train_hooks(self.run_end, self._hooks)

    # --- the state a checkpoint holds ------------------------------------------------------

    def roll_back(self, found: FoundCheckpoint) -> None:
        """Restore everything the checkpoint ``found`` holds but the data position: the
        weights, :attr:`iter`, the hooks' state (LR scheduler, divergence guard), the
        optimizer's, the gradient scaler's and AGVM's. Training goes on after the restored
        iteration on the data stream where it is, so the batches of the undone steps are
        not replayed. The hook that calls it (the divergence guard) then raises
        :class:`~largedet.engine.hooks.StepRolledBack`."""
        # the weights (and the model EMA's average)
        extra = self.checkpointer.load_found(
            found, checkpointables=[] if self.ema is None else ["model_ema"]
        )
        # the iteration, the hooks' state and the inner loop's; not the data position
        super().load_state_dict(extra["trainer"])
        self.loop.load_state_dict(extra["trainer"]["_trainer"])

    def state_dict(self):
        ret = super().state_dict()  # the hooks'
        ret["_trainer"] = self.loop.state_dict()  # the optimizer, gradient scaler, AGVM
        ret["data"] = self.data.state_dict()
        return ret

    def load_state_dict(self, state_dict):
        # the iteration, the hooks' state and the inner loop's (DefaultTrainer's entries)
        super().load_state_dict(state_dict)
        self.loop.load_state_dict(state_dict["_trainer"])
        if self.data.load_state_dict(state_dict.get("data")):
            loader = self.loop.data_loader
            self.loop.reset_data_loader(lambda: loader)
