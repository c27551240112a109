"""largedet's detection trainer: Detectron2's ``DefaultTrainer`` for very large global batches.

What it adds to ``DefaultTrainer``, each in one place:

- the global batch ``SOLVER.IMS_PER_BATCH`` on any number of devices, as
  ``IMS_PER_DEVICE``-image micro-batches accumulated K times per optimizer step
  (:func:`~largedet.solver.batch.batch_plan`, :class:`~largedet.engine.train_loop.AccumulationTrainer`),
  in full precision, float16 with a gradient scaler, or bfloat16;
- the optimizer of ``largedet.solver.build_optimizer`` (``SOLVER.OPTIMIZER``) at the LR of
  the linear scaling rule (``SOLVER.LSR``), with Detectron2's warmup schedule
  (``largedet.solver.build_lr_scheduler``);
- "SyncBN" norms that run on the CPU too (``largedet.layers``);
- DDP on CPU processes (gloo) as well as GPUs;
- exact resume: atomic checkpoints (:class:`~largedet.checkpoint.atomic.AtomicCheckpointer`)
  that also hold the data position (:class:`~largedet.data.build.ResumableLoader`), a
  resume from the newest checkpoint that loads completely, and optionally per-step
  seeding (``RESEED_EVERY_ITER``);
- the divergence guard (``SOLVER.DIVERGENCE``), whose rollback (:meth:`Trainer.roll_back`)
  sends the iteration back to the restored checkpoint's;
- a batch ramp (``SOLVER.BATCH_RAMP``, :class:`~largedet.solver.batch.BatchSchedule`): a
  smaller global batch in the first epochs through K alone, the LR following its scaling
  rule at each batch, the schedule and PMD's period in images;
- pre-emption (``PREEMPTION.SIGNALS``, :mod:`largedet.engine.preemption`): a signal ends
  the current step, a checkpoint is written and every process exits with status 75;
- model EMA (``MODEL_EMA``, :mod:`largedet.engine.ema`): a moving average of the weights,
  updated once per optimizer step, kept in checkpoints and evaluated in place of (or
  beside) the trained weights;
- AGVM (``SOLVER.AGVM``): per-part LR multipliers from each part's gradient variance,
  measured on two halves of the accumulated micro-batches (or of the processes);
- one log block at start with the run's derived numbers, and ``run_summary.json`` beside
  ``metrics.json`` with them and how each invocation ended
  (:mod:`largedet.engine.run_summary`).

With ``IMS_PER_DEVICE`` 0 (one micro-batch per step) and the LSR off it trains as
``DefaultTrainer`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import time
import weakref
from typing import List, Optional

import torch
from detectron2.config import get_cfg
from detectron2.data import MetadataCatalog
from detectron2.engine import DefaultTrainer, TrainerBase, create_ddp_model
from detectron2.engine import hooks as d2_hooks
from detectron2.engine.hooks import EvalHook, PeriodicWriter
from fvcore.nn.precise_bn import get_bn_modules
from detectron2.evaluation import verify_results
from detectron2.modeling import build_model
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventStorage
from detectron2.utils.logger import setup_logger

from .. import HAS_COMPILED_D2_OPS
from ..checkpoint import (
    AtomicCheckpointer,
    DiskFullError,
    FoundCheckpoint,
    is_disk_full,
    last_checkpoint_state,
    warn_if_low_space,
)
from ..config import add_largedet_config, amp_dtype
from ..config.validate import TRAINING_RULES, check_values
from ..data.build import (
    DetectionTrainLoader,
    ResumableLoader,
    build_test_loader,
    build_train_loader,
)
from ..evaluation.coco_evaluation import COCOEvaluator
from ..layers import resolve_sync_batchnorm
from ..optim import PART_KEY
from ..solver import (
    agvm_start_iter,
    build_agvm,
    build_lr_scheduler,
    build_optimizer,
    with_scaled_lr,
)
from ..solver.lr_scheduler import LRScaling
from ..solver.batch import BatchPlan, BatchSchedule, batch_plan
from ..solver.plan import RunPlan, run_plan
from .ema import EMAHook, ModelEMA, evaluate_with_ema
from .writers import (
    ImageClockPrinter,
    build_wandb_writers,
    StopOnFullDiskJSONWriter,
    StopOnFullDiskTensorboardXWriter,
    default_writers_stopping_on_full_disk,
    raise_if_a_log_found_no_space,
)
from .hooks import Diverged, DivergenceGuard, PruningPeriodicCheckpointer, ReseedEveryIter, SkippedImagesHook
from .elastic import LostProcessError, is_lost_process
from .preemption import Preempted, PreemptionHook
from .run_summary import RunSummaryHook
from .launch import shut_down_distributed
from .train_loop import AccumulationTrainer, StepPlan

__all__ = ["Trainer", "describe_run", "describe_warmup"]

logger = logging.getLogger(__name__)


class Trainer(TrainerBase):
    """Trains and evaluates a Detectron2 model with largedet's batch arithmetic, optimizers,
    LR rule, Sync-BN, checkpoints and hooks. Used as ``DefaultTrainer``::

        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()

    The contract. It is a Detectron2 ``TrainerBase`` (hooks, ``iter``, ``storage``) with
    ``DefaultTrainer``'s interface, not a ``DefaultTrainer`` subclass: ``DefaultTrainer``
    fixes its inner trainer, its checkpointer, its length and its loop, which are what
    largedet changes. Kept from ``DefaultTrainer``: the builder classmethods with its
    parameters (``build_model(cfg)``, ``build_optimizer(cfg, model)``,
    ``build_lr_scheduler(cfg, optimizer)``, ``build_train_loader(cfg)``,
    ``build_test_loader(cfg, name)``, ``build_evaluator(cfg, name)``; largedet's extra
    parameters come after, with defaults), ``test(cfg, model, evaluators)`` (Detectron2's own,
    on this class's builders), ``resume_or_load``, ``build_hooks``, ``build_writers``, the
    ``model``, ``optimizer`` and ``data_loader`` of the inner trainer, and the state dict's
    ``_trainer`` entry. Added: the run plan (:attr:`plan`), the inner
    :class:`~largedet.engine.train_loop.AccumulationTrainer` driven one
    :class:`~largedet.engine.train_loop.StepPlan` per step, and the hooks' stop request
    (:meth:`request_stop`).
    """

    # the inner trainer's, as DefaultTrainer exposes them
    model = property(lambda self: self._trainer.model)
    optimizer = property(lambda self: self._trainer.optimizer)
    data_loader = property(lambda self: self._trainer.data_loader)

    def __init__(self, cfg):
        # DefaultTrainer's attributes (model, optimizer and data loader through _trainer,
        # scheduler, checkpointer, start_iter, max_iter, cfg), built by the same overridable
        # builders with DefaultTrainer's arguments
        super().__init__()
        for name in ("detectron2", "largedet"):
            if not logging.getLogger(name).isEnabledFor(logging.INFO):
                setup_logger(name=name)
        # each key's declared rule (largedet.config.keys), as checked before launch, for a
        # config that did not come through a training script
        check_values(cfg, self.value_rules())

        model = self.build_model(cfg)
        data_loader = self.build_train_loader(cfg)
        if not isinstance(data_loader, ResumableLoader):
            logger.warning(
                "The training loader is not a ResumableLoader: its position is not restored on resume"
            )
        #: the run's derived numbers, computed once (:func:`~largedet.solver.plan.run_plan`)
        self.plan: RunPlan = self.build_run_plan(cfg, data_loader)
        optimizer = self.build_optimizer(cfg, model, self.plan)
        agvm = build_agvm(cfg, optimizer)

        cpu = next(model.parameters()).device.type != "cuda"
        model = create_ddp_model(
            model, broadcast_buffers=False, **({"device_ids": None} if cpu else {})
        )
        self._trainer = AccumulationTrainer(
            model,
            data_loader,
            optimizer,
            self.batch.accumulation,
            amp_dtype=self.amp_dtype(cfg),
            agvm=agvm,
            hooks_owner=weakref.proxy(self),
            parameter_clip=self.plan.parameter_clip,
        )
        self.max_iter = self.run_length(cfg)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer, self.plan, self.max_iter)
        self.ema: Optional[ModelEMA] = ModelEMA.from_config(cfg, model)
        extra = {} if self.ema is None else {"model_ema": self.ema}
        self.checkpointer = AtomicCheckpointer(
            model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self), **extra
        )
        self.start_iter = 0
        self.cfg = cfg
        self.data_seed = (
            data_loader.sampler.seed if isinstance(data_loader, ResumableLoader) else None
        )
        self.data_position = 0  # images of the global stream trained on so far
        # seconds this process spent in the evaluation hook (periodic and final evaluations)
        self.evaluation_s = 0.0
        self._rolled_back = False  # set by roll_back, read by after_step
        self.register_hooks(self.build_hooks())
        if comm.is_main_process():
            block = describe_run(
                cfg,
                self.plan,
                type(optimizer).__name__,
                _agvm_parts(optimizer, agvm),
                schedule=self.describe_schedule(cfg),
            )
            if os.path.isdir(cfg.OUTPUT_DIR):  # weights and up to two moments per weight
                weights_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
                warn_if_low_space(cfg.OUTPUT_DIR, 3 * weights_bytes, "a checkpoint")
            if self.ema is not None:
                block += f"\n  {self.ema.describe(self.batch.global_batch)}; evaluation on {cfg.MODEL_EMA.EVAL!r}"
            logger.info(block)
            _warn_unused_lsr_keys(cfg)

    @property
    def batch(self) -> BatchPlan:
        """The batch plan: global batch, devices, micro-batch, K (:attr:`plan`'s)."""
        return self.plan.batch

    @property
    def lr_scaling(self) -> LRScaling:
        """The peak LR and where it comes from (:attr:`plan`'s)."""
        return self.plan.lr

    @property
    def schedule(self) -> BatchSchedule:
        """The global batch of every step, the batch ramp's stages (:attr:`plan`'s)."""
        return self.plan.schedule

    @classmethod
    def value_rules(cls) -> tuple:
        """The rules the trainer's config is checked against when it is built: every
        declared key's (:data:`largedet.config.validate.TRAINING_RULES`)."""
        return TRAINING_RULES

    @staticmethod
    def amp_dtype(cfg) -> Optional[torch.dtype]:
        """The autocast dtype of ``SOLVER.AMP`` (None: full precision):
        :func:`largedet.config.amp_dtype`."""
        return amp_dtype(cfg)

    def describe_schedule(self, cfg) -> Optional[str]:
        """The schedule's part of the start-of-run block (warm-up, LR steps, iterations,
        epochs), or None for the one ``SOLVER`` describes. A trainer whose schedule sets
        its own length (:meth:`run_length`) describes that schedule here."""
        return None

    def run_length(self, cfg) -> int:
        """The run's length in optimizer steps, ``self.max_iter``: where the training loop
        stops, what the writers' ETA counts down and the steps the LR schedule of
        :meth:`build_lr_scheduler` spans. ``SOLVER.MAX_ITER`` here, or the batch ramp's
        steps (:attr:`schedule`); a trainer whose schedule sets its own length (the video
        project's multigrid plan) overrides it, and :meth:`build_lr_scheduler` with it.
        Called in ``__init__`` before the scheduler and the hooks are built."""
        return self.schedule.total_steps

    def build_run_plan(self, cfg, data_loader) -> RunPlan:
        """The run plan (:func:`~largedet.solver.plan.run_plan`) on this job's processes, for
        the training loader's dataset (whose size a batch ramp's epochs need)."""
        size = data_loader.dataset_size if isinstance(data_loader, ResumableLoader) else None
        return run_plan(cfg, comm.get_world_size(), size)

    # --- builders -----------------------------------------------------------------------

    @classmethod
    def build_model(cls, cfg):
        """Detectron2's ``build_model``, with "SyncBN" layers made runnable on ``MODEL.DEVICE``."""
        model = resolve_sync_batchnorm(build_model(cfg), cfg.MODEL.DEVICE)
        logger.info("Model:\n%s", model)
        return model

    @classmethod
    def build_optimizer(cls, cfg, model, plan: Optional[RunPlan] = None):
        """``largedet.solver.build_optimizer`` (``SOLVER.OPTIMIZER``) at the peak LR of the run
        plan ``plan`` (called as Detectron2's ``build_optimizer(cfg, model)``: of
        ``SOLVER.LSR``). Gradients are clipped by the training loop, not by a wrapper."""
        return build_optimizer(with_scaled_lr(cfg, plan.lr if plan else None), model, accumulates=True)

    @classmethod
    def build_lr_scheduler(
        cls, cfg, optimizer, plan: Optional[RunPlan] = None, max_iter: Optional[int] = None
    ):
        """Detectron2's warmup + schedule around the peak LR (``largedet.solver.build_lr_scheduler``)
        over ``max_iter`` steps (default ``SOLVER.MAX_ITER``; the trainer passes
        :meth:`run_length`'s). ``plan``: the run plan (:meth:`build_run_plan`), which a batch
        ramp (``SOLVER.BATCH_RAMP``) needs: the LR then follows the ramp's images and
        batches. Called as Detectron2's ``build_lr_scheduler(cfg, optimizer)`` it is the
        schedule of a run without a ramp."""
        if plan is None and cfg.SOLVER.BATCH_RAMP.BATCHES:
            raise ValueError(
                "SOLVER.BATCH_RAMP: build_lr_scheduler needs the run plan "
                "(Trainer.build_run_plan), whose steps depend on the dataset size"
            )
        return build_lr_scheduler(cfg, optimizer, max_iter, plan=plan)

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
        """COCO evaluation (pycocotools where Detectron2's compiled evaluator is absent), or
        the Open Images Challenge metric for OpenImages datasets."""
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference")
        evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type", "coco")
        if evaluator_type == "coco":
            return COCOEvaluator(
                dataset_name, output_dir=output_folder, use_fast_impl=HAS_COMPILED_D2_OPS
            )
        if evaluator_type == "openimages":
            from ..evaluation import OIDEvaluator

            return OIDEvaluator(cfg, dataset_name, output_dir=output_folder)
        raise ValueError(
            f"No evaluator for dataset {dataset_name!r} (evaluator_type={evaluator_type!r})"
        )

    def build_hooks(self):
        """Detectron2's hooks, with per-step seeding (``RESEED_EVERY_ITER``) and the divergence
        guard after the timer: before the LR scheduler and the checkpointer; metrics are
        written every ``LOG_PERIOD`` steps, ``data/skipped_images`` among them."""
        hooks = self._detectron2_hooks()
        ours = [DivergenceGuard.from_config(self.cfg)]
        if self.ema is not None:  # after the guard: a rolled-back step is not averaged
            ours.append(EMAHook(self.ema, self.batch_at))
            hooks = [self._ema_eval_hook() if isinstance(h, EvalHook) else h for h in hooks]
        # pre-emption: after the LR step and the periodic checkpoint, before evaluating
        evaluation = next(i for i, h in enumerate(hooks) if isinstance(h, EvalHook))
        hooks.insert(evaluation, PreemptionHook(self.cfg.PREEMPTION.SIGNALS))
        if self.cfg.RESEED_EVERY_ITER:
            ours.insert(0, ReseedEveryIter(self.cfg.SEED))
        if isinstance(self._trainer.data_loader, DetectionTrainLoader):
            ours.append(SkippedImagesHook(self._trainer.data_loader, self.cfg.LOG_PERIOD))
        hooks[1:1] = ours
        hooks.append(RunSummaryHook())
        return hooks

    def _detectron2_hooks(self) -> list:
        """The hooks of ``DefaultTrainer.build_hooks``, in its order, with the writers'
        period ``LOG_PERIOD`` (Detectron2's is fixed at 20)."""
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.DATALOADER.NUM_WORKERS = 0  # PreciseBN's own loader, as Detectron2 builds it
        precise_bn = cfg.TEST.PRECISE_BN.ENABLED and get_bn_modules(self.model)
        # The order is Detectron2's and matters: the timer first (it times the other hooks
        # out of the step); the LR steps before anything reads it; precise BN before the
        # checkpointer, so that checkpoints hold the recomputed statistics; the checkpointer
        # before the evaluation, so that a failed evaluation loses no trained step; the
        # writers last, so that they write the evaluation's results of the same step.
        hooks = [
            d2_hooks.IterationTimer(),
            d2_hooks.LRScheduler(),
            d2_hooks.PreciseBN(
                cfg.TEST.EVAL_PERIOD, self.model, self.build_train_loader(cfg),
                cfg.TEST.PRECISE_BN.NUM_ITER,
            ) if precise_bn else None,
        ]  # fmt: skip
        if comm.is_main_process():
            hooks.append(PruningPeriodicCheckpointer(
                self.checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD, cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP
            ))  # fmt: skip

        def test_and_save_results():
            with self._timed_evaluation():
                self._last_eval_results = self.test(self.cfg, self.model)
            return self._last_eval_results

        hooks.append(EvalHook(cfg.TEST.EVAL_PERIOD, test_and_save_results))
        if comm.is_main_process():
            hooks.append(PeriodicWriter(self.build_writers(), period=self.cfg.LOG_PERIOD))
        return hooks

    def _ema_eval_hook(self) -> EvalHook:
        # Detectron2's evaluation hook, testing the weights MODEL_EMA.EVAL names
        def test_and_save_results():
            with self._timed_evaluation():
                self._last_eval_results = evaluate_with_ema(
                    self.test, self.cfg, self.model, self.ema, self.cfg.MODEL_EMA.EVAL
                )
            return self._last_eval_results

        return EvalHook(self.cfg.TEST.EVAL_PERIOD, test_and_save_results)

    @contextlib.contextmanager
    def _timed_evaluation(self):
        # the evaluation hook's wall-clock, added to evaluation_s (left out of images/s)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.evaluation_s += time.perf_counter() - start

    def batch_at(self, iteration: int) -> int:
        """The global batch of optimizer step ``iteration`` (0-based)."""
        return self.schedule.batch_at(iteration)

    def build_writers(self):
        """Detectron2's writers (console with the ETA, ``metrics.json``, TensorBoard) over
        :meth:`run_length` steps, and W&B's with ``WANDB.ENABLED``. With a batch ramp the
        console's ETA counts images, not steps (:class:`~largedet.engine.writers.ImageClockPrinter`).
        The file writers stop the run with one :class:`~largedet.checkpoint.DiskFullError` on
        a full disk (:func:`~largedet.engine.writers.default_writers_stopping_on_full_disk`)."""
        writers = default_writers_stopping_on_full_disk(self.cfg.OUTPUT_DIR, self.max_iter)
        if self.schedule.ramped and self.schedule.total_steps == self.max_iter:
            writers = [ImageClockPrinter(self.schedule) if isinstance(w, CommonMetricPrinter) else w
                       for w in writers]  # fmt: skip
        return writers + build_wandb_writers(self.cfg)

    # --- training -----------------------------------------------------------------------

    @property
    def last_losses(self):
        """The last step's losses, averaged over micro-batches and ranks."""
        return self._trainer.last_losses

    @property
    def last_total_loss(self) -> float:
        return self._trainer.last_total_loss

    @property
    def last_grad_norm(self) -> float:
        """The last step's gradient norm (NaN or inf when the step was skipped)."""
        return self._trainer.last_grad_norm

    @property
    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """The fp16 gradient scaler (None in full precision and bfloat16)."""
        return self._trainer.grad_scaler

    # --- stopping: the hooks' public channel ---------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Ask every rank to stop: the request travels with the next step's metrics
        all-gather, after which :attr:`stop_agreed` is true on every rank. Safe to call
        from a signal handler (:class:`~largedet.engine.preemption.PreemptionHook` does)."""
        self._trainer.request_stop(signum)

    @property
    def stop_requested(self) -> int:
        """The signal this rank was asked to stop by (0: none)."""
        return self._trainer.stop_requested

    @property
    def stop_agreed(self) -> bool:
        """Whether some rank's stop request was seen at the last step, by every rank."""
        return self._trainer.stop_agreed

    @property
    def stop_signals(self) -> List[int]:
        """Each rank's stop request at the last step (0: none), as the all-gather saw them."""
        return self._trainer.stop_signals

    def resume_or_load(self, resume=True):
        """``DefaultTrainer.resume_or_load`` with :class:`AtomicCheckpointer`'s resume: from
        the newest checkpoint in ``OUTPUT_DIR`` that loads completely, tagged or not; never
        from scratch when checkpoints exist but none loads (an error says why)."""
        self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        if self.checkpointer.resumed_from:
            # the checkpoint holds the iteration that had just finished
            self.start_iter = self.iter + 1
        if resume:  # the steps trained after the checkpoint are trained again: logged once
            self._drop_logged_steps_from(self.start_iter)

    def _drop_logged_steps_from(self, iteration: int) -> None:
        for hook in self._hooks:
            for writer in getattr(hook, "_writers", ()):  # Detectron2's PeriodicWriter
                if isinstance(writer, (StopOnFullDiskJSONWriter, StopOnFullDiskTensorboardXWriter)):
                    dropped = writer.drop_records_from(iteration)
                    if dropped:
                        logger.info(
                            "metrics.json: dropped %d record(s) of the steps from %d on, which "
                            "this run trains again", dropped, iteration,
                        )  # fmt: skip

    def before_train(self):
        # Create the data iterator now: the loader draws its base seed from torch's global
        # generator when the iterator is made, which must not fall inside a step (a run
        # resumed at step n would make it in step n, an uninterrupted one in step 0).
        self._trainer._data_loader_iter
        super().before_train()

    def run_step(self):
        """One optimizer step of the plan's: its K, total-norm clip and, with a batch ramp,
        PMD's clock (:class:`~largedet.engine.train_loop.StepPlan`)."""
        self._trainer.run_planned_step(self.iter, self.step_plan(self.iter))
        self.data_position += self.plan.batch_at(self.iter)

    def step_plan(self, iteration: int) -> StepPlan:
        """What step ``iteration`` of :attr:`plan` asks of the training loop."""
        plan = self.plan
        return StepPlan(
            accumulation=plan.accumulation_at(iteration),
            clip_max_norm=plan.clip_at(iteration),
            clock=plan.clock(iteration) if plan.schedule.ramped else None,
        )

    def train(self):
        """Train, then return the last evaluation results (``{}`` when none ran).

        The loop of Detectron2's ``TrainerBase.train``, except that it follows
        :attr:`iter` when a rollback (:meth:`roll_back`) sends it back: training goes on
        from the iteration after the restored one, until ``max_iter``. After a
        distributed run that ended without an error, :func:`shut_down_distributed` is
        registered to run when the process exits.
        """
        loop_logger = logging.getLogger("detectron2.engine.train_loop")  # its messages as before
        loop_logger.info("Starting training from iteration %d", self.start_iter)
        self.iter = self.start_iter
        self.end_status = None  # how this invocation ended, for the run summary
        with EventStorage(self.start_iter) as self.storage:
            try:
                self.before_train()
                while self.iter < self.max_iter:
                    self.before_step()
                    self.run_step()
                    self.after_step()
                    self.iter += 1
                self.end_status = "finished"
            except Preempted:
                self.end_status = "preempted"
                raise
            except FloatingPointError as e:
                self.end_status = "diverged"
                message = str(e)
                if not message.startswith("Training diverged"):  # Detectron2's own check
                    tag = self.checkpointer.get_checkpoint_file() if self.checkpointer.has_checkpoint() else ""
                    message = (f"Training diverged at iteration {self.iter}: {' '.join(message.split())} "
                               f"(a check in the model's forward pass). Last good checkpoint: {tag or 'none'}")  # fmt: skip
                loop_logger.error("%s; lower SOLVER.BASE_LR, or see SOLVER.DIVERGENCE.ROLLBACK", message)
                raise Diverged(message) from None
            except DiskFullError as e:  # one line, no traceback
                self.end_status = "failed"
                loop_logger.error("%s", e)
                raise
            except Exception as e:
                self.end_status = "failed"
                if comm.get_world_size() > 1 and is_lost_process(e):
                    self.end_status = "lost_process"
                    lost = LostProcessError(
                        f"iteration {self.iter}: a collective failed, a process of the job was lost "
                        f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:300]}); "
                        f"{last_checkpoint_state(self.cfg.OUTPUT_DIR)}"
                    )
                    loop_logger.error("%s", lost)
                    raise lost from None
                if not is_disk_full(e):
                    loop_logger.exception("Exception during training:")
                    raise
                full = DiskFullError(  # a write of Detectron2's or another library's
                    f"{e.filename or self.cfg.OUTPUT_DIR}: no space left on the device "
                    f"({e.strerror}); training stopped; {last_checkpoint_state(self.cfg.OUTPUT_DIR)}"
                )
                full.errno = e.errno
                loop_logger.error("%s", full)
                raise full from None
            except BaseException:
                self.end_status = "interrupted"
                raise
            finally:
                self.after_train()
        if comm.get_world_size() > 1:
            _shut_down_distributed_at_exit()
        if len(self.cfg.TEST.EXPECTED_RESULTS) and comm.is_main_process():
            assert hasattr(self, "_last_eval_results"), "No evaluation results during training!"
            verify_results(self.cfg, self._last_eval_results)
        return getattr(self, "_last_eval_results", None) or {}

    def after_step(self):
        """Every hook's ``after_step`` in order, but none after a hook that rolled back
        (:meth:`roll_back`): the step they would act on (save, evaluate, step the LR,
        write) was undone. Then a log file that found no space during the step stops the
        run (:func:`~largedet.engine.writers.raise_if_a_log_found_no_space`)."""
        self._rolled_back = False
        for hook in self._hooks:
            hook.after_step()
            if self._rolled_back:
                break
        raise_if_a_log_found_no_space()

    def after_train(self):
        """Every hook's ``after_train`` in order, as Detectron2's, except that a pre-emption
        during the final evaluation (:class:`Preempted`) or a full disk
        (:class:`~largedet.checkpoint.DiskFullError`) in one hook lets the later ones run
        (the last metrics, ``run_summary.json`` with how the run ended) before it is
        raised. After a run that stopped on an error, another hook's error is logged in one
        line and the later hooks still run. After a lost process of the job
        (:class:`~largedet.engine.elastic.LostProcessError`) the evaluation and checkpoint
        hooks do not run: they would wait on the broken process group, or save a step that
        did not finish. The pre-emption handlers are put back at the end."""
        self.storage.iter = self.iter
        stopped = None
        try:
            for hook in self._hooks:
                if getattr(self, "end_status", None) == "lost_process" and isinstance(hook, (EvalHook, d2_hooks.PeriodicCheckpointer)):
                    continue
                try:
                    hook.after_train()
                except (Preempted, DiskFullError) as e:
                    if isinstance(e, Preempted):
                        self.end_status = "preempted"
                    elif getattr(self, "end_status", None) != "preempted":
                        self.end_status = "failed"
                    stopped = stopped or e
                except Exception as e:
                    if self.end_status == "finished":
                        raise
                    # the run stopped already, for a reason that is being raised: say this
                    # one in a line, and let the later hooks record how the run ended
                    logger.warning("%s.after_train failed after the run stopped: %s: %s",
                                   type(hook).__name__, type(e).__name__, e)  # fmt: skip
        finally:
            for hook in self._hooks:
                if isinstance(hook, PreemptionHook):
                    hook.restore_signals()
        if stopped is not None:
            raise stopped

    def roll_back(self, found: FoundCheckpoint) -> None:
        """Restore everything the checkpoint ``found`` holds but the data position: the
        weights, :attr:`iter`, the hooks' state (LR scheduler, divergence guard), the
        optimizer's, the gradient scaler's and AGVM's. Training goes on after the restored
        iteration on the data stream where it is, so the batches of the undone steps are
        not replayed. Called from a hook's ``after_step``; the hooks after it are skipped
        for this step."""
        # the weights (and the model EMA's average)
        extra = self.checkpointer.load_found(
            found, checkpointables=[] if self.ema is None else ["model_ema"]
        )
        self._load_loop_state(extra["trainer"])  # not the data position
        self._rolled_back = True

    @property
    def agvm(self):
        """The run's :class:`~largedet.optim.AGVM` (None when ``SOLVER.AGVM.ENABLED`` is false)."""
        return self._trainer.agvm

    def state_dict(self):
        ret = super().state_dict()  # the hooks'
        ret["_trainer"] = self._trainer.state_dict()  # the optimizer, gradient scaler, AGVM
        ret["data"] = {
            "seed": self.data_seed,
            "position": self.data_position,
            "world_size": self.batch.world_size,
            "per_device": self.batch.per_device,
        }
        return ret

    def _load_loop_state(self, state_dict) -> None:
        # the iteration, the hooks' state and the inner trainer's (DefaultTrainer's entries)
        super().load_state_dict(state_dict)
        self._trainer.load_state_dict(state_dict["_trainer"])

    def load_state_dict(self, state_dict):
        self._load_loop_state(state_dict)
        data = state_dict.get("data")
        loader = self._trainer.data_loader
        if data is None or not isinstance(loader, ResumableLoader):
            logger.warning("Resuming without a data position: the data stream restarts")
            return
        self.data_seed, self.data_position = data["seed"], data["position"]
        loader.seek(self.data_position, self.data_seed)
        self._trainer.reset_data_loader(lambda: loader)
        logger.info(
            "Data stream resumes after %d images (seed %d)", self.data_position, self.data_seed
        )
        self._log_layout_change(data, loader)

    def _log_layout_change(self, data: dict, loader) -> None:
        """Say so when the run resumes on another number of processes or micro-batch size
        than the checkpoint's, and what stays exact."""
        world, per_device = data.get("world_size"), data.get("per_device")
        if world is None or (world, per_device) == (self.batch.world_size, self.batch.per_device):
            return
        old_k = self.batch.global_batch // (world * per_device)
        regrouped = (
            loader.regrouped_images(world, per_device, self.data_position)
            if isinstance(loader, DetectionTrainLoader)
            else None
        )
        if regrouped is None:
            stream = "the data stream continues exactly (no image repeated or skipped)"
        elif regrouped == 0:
            stream = "aspect-ratio grouping regroups the same images (none repeated or skipped)"
        else:
            stream = (
                f"aspect-ratio grouping regroups the stream on the new layout: {regrouped} of the "
                f"{self.data_position} images trained on are trained again and {regrouped} not yet "
                "trained on are skipped"
            )
        logger.warning(
            "Resuming on %d process(es) x %d image(s) per pass x K = %d (the checkpoint's run: "
            "%d x %d x K = %d): the global batch %d, the LR schedule and the data position carry "
            "over; %s; the weights are not bit-exact with an uninterrupted run (gradients are "
            "summed in another order, BN sees other micro-batches)",
            self.batch.world_size, self.batch.per_device, self.batch.accumulation,
            world, per_device, old_k, self.batch.global_batch, stream,
        )  # fmt: skip


@functools.lru_cache(maxsize=None)
def _shut_down_distributed_at_exit() -> None:
    # once per process; atexit handlers run before the interpreter starts to finalize
    atexit.register(shut_down_distributed)


def _warn_unused_lsr_keys(cfg) -> None:
    lsr, default = cfg.SOLVER.LSR, add_largedet_config(get_cfg()).SOLVER.LSR
    if not lsr.ENABLED and (lsr.REFERENCE_BATCH, lsr.REFERENCE_LR) != (
        default.REFERENCE_BATCH,
        default.REFERENCE_LR,
    ):
        logger.warning(
            "SOLVER.LSR.REFERENCE_BATCH / REFERENCE_LR are set but SOLVER.LSR.ENABLED is false: "
            "the LR is SOLVER.BASE_LR (%g); set SOLVER.LSR.ENABLED True to scale the reference LR",
            cfg.SOLVER.BASE_LR,
        )


def describe_run(
    cfg,
    plan: RunPlan,
    optimizer_name: str,
    agvm_parts: Optional[str] = None,
    schedule: Optional[str] = None,
) -> str:
    """The block of derived numbers logged at the start of training, all read from the run
    plan ``plan`` (:func:`~largedet.solver.plan.run_plan` of ``cfg``). ``agvm_parts``: the
    AGVM parts with their parameter counts (default: the part names of the config);
    ``schedule``: what replaces the lines of the ``SOLVER`` schedule (warm-up, LR steps,
    iterations and epochs), for a trainer that runs another one."""
    solver, batch, scaling = cfg.SOLVER, plan.batch, plan.lr
    epochs = (
        f"{plan.epochs:.2f} epochs of {plan.dataset_size} images"
        if plan.dataset_size
        else "epochs unknown"
    )
    if amp_dtype(cfg) is not None:
        amp = f"AMP {solver.AMP.PRECISION}"
    elif solver.AMP.ENABLED:  # SOLVER.AMP.NATIVE_ONLY on a device without it
        amp = (
            f"full precision: {cfg.MODEL.DEVICE} has no native {solver.AMP.PRECISION} "
            "(SOLVER.AMP.NATIVE_ONLY)"
        )
    else:
        amp = "full precision"
    lines = [
        "Large-batch run:",
        f"  world size {batch.world_size}; global batch {batch.global_batch} (SOLVER.IMS_PER_BATCH); "
        f"{batch.per_device} image(s) per device per pass; {batch.accumulation} accumulation step(s) "
        f"per optimizer step; {amp}",
        f"  optimizer {optimizer_name} (SOLVER.OPTIMIZER {solver.OPTIMIZER}); {scaling.describe()}",
    ]
    if schedule is None:
        lines.append(f"  {describe_warmup(cfg, plan.warmup_iters, scaling.lr, plan.warmup_images)}; "
                     f"{_describe_shape(solver)}")  # fmt: skip
        lines.append(
            f"  {plan.max_iter} iterations x {batch.global_batch} = {plan.total_images} images = {epochs}"
        )
    else:
        lines.extend("  " + line for line in schedule.splitlines())
    if plan.schedule.ramped:
        lines.append("  " + plan.schedule.describe(plan.dataset_size))
    clipping = plan.describe_clipping()
    if clipping:
        lines.append("  " + clipping)
    if solver.AGVM.ENABLED:
        lines.append("  " + _describe_agvm(cfg, batch, agvm_parts))
    return "\n".join(lines)


def describe_warmup(cfg, warmup_iters: int, peak_lr: float, warmup_images: Optional[int] = None) -> str:
    """The warm-up's part of the start-of-run block: ``warmup_iters`` steps of the full batch
    (``warmup_images`` images) from ``WARMUP_FACTOR x peak_lr`` to ``peak_lr``; where that is
    shorter than ``SOLVER.WARMUP_ITERS`` (:func:`~largedet.solver.warmup_steps`), why."""
    solver = cfg.SOLVER
    shortened = ""
    if warmup_iters < solver.WARMUP_ITERS:
        shortened = f" (SOLVER.WARMUP_ITERS {solver.WARMUP_ITERS} shortened: it ends at the peak LR within the run"
        if solver.LR_SCHEDULER_NAME == "WarmupStableDecayLR":
            shortened += f", before the decay at {solver.WSD.DECAY_START:g} of it"
        shortened += ")"
    if not warmup_iters:
        return "no warmup" + shortened
    images = f" ({warmup_images} images)" if warmup_images else ""
    return (
        f"{solver.WARMUP_METHOD} warmup over {warmup_iters} iterations{images} from "
        f"{solver.WARMUP_FACTOR:g} x LR = {solver.WARMUP_FACTOR * peak_lr:g} to {peak_lr:g}{shortened}"
    )


def _describe_shape(solver) -> str:
    name = solver.LR_SCHEDULER_NAME
    if name == "WarmupStableDecayLR":
        return (
            f"WarmupStableDecayLR: the peak LR until {solver.WSD.DECAY_START:g} of the run, "
            f"then linear to {solver.BASE_LR_END:g}"
        )
    if name == "WarmupCosineLR":
        return f"WarmupCosineLR: cosine from the peak LR to {solver.BASE_LR_END:g} at the run's end"
    if name == "WarmupStepWithFixedGammaLR":
        return f"WarmupStepWithFixedGammaLR: x {solver.GAMMA:g} at {solver.NUM_DECAYS} evenly spaced steps"
    if solver.STEPS:  # WarmupMultiStepLR, a LazyConfig's schedule with milestones
        return f"{name} with steps {tuple(solver.STEPS)}"
    return name


def _agvm_parts(optimizer, agvm) -> Optional[str]:
    if agvm is None:
        return None
    counts = {name: [0, 0] for name in agvm.parts}  # param groups, tensors
    for group in optimizer.param_groups:
        counts[group[PART_KEY]][0] += 1
        counts[group[PART_KEY]][1] += len(group["params"])
    return ", ".join(f"{n} ({g} param groups, {t} tensors)" for n, (g, t) in counts.items())


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _describe_agvm(cfg, batch: BatchPlan, parts: Optional[str]) -> str:
    agvm = cfg.SOLVER.AGVM
    if batch.accumulation >= 2:
        k, h = batch.accumulation, batch.accumulation // 2
        halves = f"micro-batches {_span(1, h)} vs {_span(h + 1, k)} of each step"
    else:
        w, h = batch.world_size, batch.world_size // 2
        halves = f"processes {_span(0, h - 1)} vs {_span(h, w - 1)}"
    if parts is None:
        parts = ", ".join(dict.fromkeys(name for name, _ in agvm.GROUPS))
    return (
        f"AGVM: parts {parts} aligned with {agvm.REFERENCE}; phi every {agvm.PERIOD} steps from "
        f"iteration {agvm_start_iter(cfg)} on {halves}; clamp {tuple(agvm.CLAMP)}, "
        f"momentum {agvm.MOMENTUM:g}"
    )
