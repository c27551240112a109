"""``add_largedet_config(cfg)``: every key largedet adds to Detectron2's config.

Each key is commented where it is defined: meaning, unit, scope (per device or
global), allowed values and the paper's symbol. A key with a value rule (checked before
launch) or a LazyConfig name (``train.<name>``) is declared by one
:func:`~largedet.config.keys.declare` call that gives both with the default. Derived values (accumulation
steps, scaled LR) are never stored here; they are computed and logged at start.
"""

from detectron2.config import CfgNode as CN
from detectron2.config import get_cfg

from .agvm_keys import add_agvm_config
from .keys import (
    declare,
    fraction,
    int_at_least,
    lr_factor,
    non_negative,
    number,
    one_of,
    pair_of,
    positive,
    positive_or_none,
    spike_factor,
    when_ema,
    when_lsr,
    when_wsd,
)

__all__ = [
    "AMP_PRECISIONS",
    "BUFFER_MODES",
    "COMPILED_STEP_MODES",
    "EMA_EVAL_MODES",
    "LSR_RULES",
    "MOMENT_DECAYS",
    "add_largedet_config",
]

#: MODEL_EMA.BUFFERS: what the average does with floating-point buffers
BUFFER_MODES = ("average", "copy")
#: MODEL_EMA.EVAL: which weights an evaluation of a run with EMA tests
EMA_EVAL_MODES = ("ema", "model", "both")
#: SOLVER.AMP.PRECISION: the autocast dtypes
AMP_PRECISIONS = ("bfloat16", "float16")
#: SOLVER.LSR.RULE: the scaling rules (each formula: :data:`largedet.solver.plan.LSR_RULES`)
LSR_RULES = ("linear", "sqrt")
#: SOLVER.PMD.DECAY: the decay shapes inside a period (:data:`largedet.optim.MOMENT_DECAYS`)
MOMENT_DECAYS = ("cosine", "linear", "none")
#: SOLVER.COMPILED_STEP: when the compiled step runs (:data:`largedet.optim.COMPILED_STEP_MODES`)
COMPILED_STEP_MODES = ("auto", "always", "never")


def add_largedet_config(cfg: CN) -> CN:
    """Add largedet's keys (with defaults) to a Detectron2 config, in place; returns it."""
    _add_data_config(cfg)
    _add_solver_config(cfg)
    _add_large_batch_config(cfg)
    add_agvm_config(cfg)
    _add_ema_config(cfg)
    _add_openimages_config(cfg)
    _add_logging_config(cfg)
    _add_extension_config(cfg)
    return cfg


def _add_data_config(cfg: CN) -> None:
    # --- the user's own COCO-format datasets (largedet.data.coco_json) -----------
    # A list of [name, json_file, image_root] triples: each COCO instances file is
    # registered under its name (Detectron2's register_coco_instances, evaluated by
    # COCOEvaluator) for DATASETS.TRAIN and DATASETS.TEST, e.g.
    # [["my_train", "/data/my/train.json", "/data/my/train"]]. Each file is read and
    # checked before launch (JSON, category ids, boxes); a name that a built-in dataset
    # has is refused. Paths may start with ~.
    cfg.DATASETS.COCO_JSONS = []

    # --- built-in synthetic "shapes" dataset (largedet.data.shapes) -------------
    cfg.DATASETS.SHAPES = CN()
    # Folder where the generated dataset is cached; "" means $LARGEDET_DATASETS
    # or ~/.cache/largedet/datasets.
    cfg.DATASETS.SHAPES.ROOT = ""
    # Number of generated training / validation images.
    cfg.DATASETS.SHAPES.NUM_TRAIN = 1500
    cfg.DATASETS.SHAPES.NUM_VAL = 150
    # Side length of the square generated images, in pixels.
    cfg.DATASETS.SHAPES.IMAGE_SIZE = 128
    # Seed of the generator: the same seed writes the same bytes.
    cfg.DATASETS.SHAPES.SEED = 0
    # Seed of a second, independent copy registered as "shapes_holdout_train" and
    # "shapes_holdout_val" (same sizes): a held-out split on which to choose a recipe
    # before reporting on "shapes_val". Negative: not registered.
    cfg.DATASETS.SHAPES.HOLDOUT_SEED = 1000


def _add_solver_config(cfg: CN) -> None:
    # --- optimizers (largedet.optim, largedet.solver) ----------------------------
    # Optimizer, by its name in largedet.solver.OPTIMIZER_REGISTRY: "SGD", "AdamW",
    # "LAMB", "PMD_LAMB", "LARS", or a name a user registered there. All use
    # SOLVER.BASE_LR and SOLVER.WEIGHT_DECAY; SGD and LARS also SOLVER.MOMENTUM.
    cfg.SOLVER.OPTIMIZER = "SGD"
    # Multi-tensor (torch._foreach_*) optimizer step: true (fast) or false (a loop
    # over parameter tensors; the same numbers for LAMB, PMD_LAMB and LARS).
    cfg.SOLVER.FOREACH = True
    # The compiled step of LAMB, PMD_LAMB and LARS (torch.compile: generated kernels,
    # tensor by tensor; docs/pmd_lamb.md, "The compiled step"): "auto" (where it was
    # measured faster: on the CPU, tensors of 32,768 elements or more), "always" or "never".
    declare(cfg, "SOLVER.COMPILED_STEP", "auto", one_of(COMPILED_STEP_MODES))
    # Whether LAMB, PMD_LAMB and LARS apply their layer-wise trust ratio to the
    # parameters of normalization layers (BatchNorm, SyncBN, GroupNorm, LayerNorm, ...);
    # false: trust ratio 1 for them. Their weight decay is SOLVER.WEIGHT_DECAY_NORM.
    cfg.SOLVER.ADAPT_NORM = False
    # The same for bias parameters, whose weight decay is SOLVER.WEIGHT_DECAY_BIAS.
    cfg.SOLVER.ADAPT_BIAS = False
    # Weight decay (lambda) of bias parameters. Detectron2's key, whose default None
    # means SOLVER.WEIGHT_DECAY; largedet gives biases no weight decay by default,
    # like norm layers (Detectron2's SOLVER.WEIGHT_DECAY_NORM is 0).
    cfg.SOLVER.WEIGHT_DECAY_BIAS = 0.0

    cfg.SOLVER.LAMB = CN()
    # (beta1, beta2) of LAMB and PMD_LAMB: decay rates of the first and second
    # gradient moments, each in [0, 1).
    declare(cfg, "SOLVER.LAMB.BETAS", (0.9, 0.999), ("two numbers in [0, 1)", pair_of(fraction)))
    # eps of LAMB and PMD_LAMB, added to sqrt(v_t / b_t) in the update's
    # denominator; > 0, in units of the gradient.
    declare(cfg, "SOLVER.LAMB.EPS", 1e-6, ("a number > 0", positive))
    # Upper clamp of the layer-wise trust ratio ||w|| / ||x|| of LAMB and PMD_LAMB;
    # > 0, or None for no clamp.
    declare(cfg, "SOLVER.LAMB.MAX_TRUST_RATIO", 10.0, ("a number > 0, or None", positive_or_none))

    cfg.SOLVER.PMD = CN()
    # Period T of PMD_LAMB's moment decay, in optimizer steps (iterations); an
    # integer >= 1. Within each period the moments' decay coefficient gamma falls
    # from 1 towards 0, then restarts.
    declare(cfg, "SOLVER.PMD.PERIOD", 200, ("an integer >= 1 (optimizer steps)", int_at_least(1)))
    # Shape d(u) of gamma over the position u in [0, 1) inside a period:
    # "cosine" ((1 + cos(pi u)) / 2), "linear" (1 - u) or "none" (1: plain LAMB).
    declare(cfg, "SOLVER.PMD.DECAY", "cosine", one_of(MOMENT_DECAYS))

    cfg.SOLVER.LARS = CN()
    # Trust coefficient eta of LARS: trust = eta ||w|| / (||g|| + lambda ||w||); > 0.
    declare(cfg, "SOLVER.LARS.ETA", 0.001, ("a number > 0", positive))


def _add_large_batch_config(cfg: CN) -> None:
    # --- global batch, accumulation, LSR, warm-up, Sync-BN (largedet.engine) ------
    # SOLVER.IMS_PER_BATCH (Detectron2's key) is the global batch B: images per
    # optimizer step, summed over all devices and accumulated micro-batches.
    #
    # Images one device holds in one forward/backward pass (the micro-batch), per
    # device. The trainer accumulates K = IMS_PER_BATCH / (world size x IMS_PER_DEVICE)
    # micro-batches per optimizer step, which must be a whole number (checked before
    # any worker starts). 0 means IMS_PER_BATCH / world size, i.e. K = 1: Detectron2's
    # behaviour. K is computed at start and logged, never stored here.
    declare(cfg, "SOLVER.IMS_PER_DEVICE", 0, lazy="ims_per_device")

    cfg.SOLVER.BATCH_RAMP = CN()
    # Batch ramp: global batches (images per optimizer step) of the stages that train
    # before SOLVER.IMS_PER_BATCH, e.g. (256, 512); () is no ramp. Each is a whole
    # multiple of world size x IMS_PER_DEVICE (> 0) below IMS_PER_BATCH: the ramp changes
    # K alone (checked before any worker starts). With a ramp the run is defined in
    # images: it trains MAX_ITER x IMS_PER_BATCH images; WARMUP_ITERS, STEPS and
    # SOLVER.PMD.PERIOD are read as that many steps of IMS_PER_BATCH images; the LR at a
    # stage's batch b is the peak LR x SOLVER.LSR.RULE(b / IMS_PER_BATCH), times the
    # schedule at the images seen; the run's steps and each stage's are logged at start.
    declare(cfg, "SOLVER.BATCH_RAMP.BATCHES", (), lazy="batch_ramp.batches")
    # End of each stage of BATCHES, in epochs of the training set, increasing, > 0, before
    # the run's end; a stage's last step may pass its end by less than one of its batches.
    declare(cfg, "SOLVER.BATCH_RAMP.EPOCHS", (), lazy="batch_ramp.epochs")

    # SOLVER.LR_SCHEDULER_NAME also takes "WarmupStableDecayLR" (warm-up-stable-decay):
    # after the warm-up the LR stays at its peak until WSD.DECAY_START, then falls
    # linearly to SOLVER.BASE_LR_END at the end of the run.
    cfg.SOLVER.WSD = CN()
    # Where the decay starts, as a fraction of the run (of its images with a batch
    # ramp), in (0, 1); 0.8: the last fifth decays.
    declare(
        cfg,
        "SOLVER.WSD.DECAY_START",
        0.8,
        ("a number in (0, 1)", lambda v: number(v) and 0 < v < 1),
        when=when_wsd,
    )

    cfg.SOLVER.WARMUP_CLIP = CN()
    # Gradient-norm clipping around the end of warm-up, for any optimizer (AGVM's released
    # configs clip there): the global L2 norm of the step's gradient (after averaging over
    # micro-batches and devices, after unscaling) is clipped to MAX_NORM at the steps from
    # ITERS[0] before to ITERS[1] after SOLVER.WARMUP_ITERS (in steps of IMS_PER_BATCH:
    # images with a batch ramp). A float >= 0; 0 turns it off. The norm is logged as
    # grad_norm (before clipping) at every logged step.
    declare(cfg, "SOLVER.WARMUP_CLIP.MAX_NORM", 0.0, ("a number >= 0 (0: off)", non_negative))
    # (before, after): steps before and after the end of warm-up that clip; integers >= 0.
    declare(
        cfg,
        "SOLVER.WARMUP_CLIP.ITERS",
        (50, 50),
        ("two integers >= 0", pair_of(int_at_least(0))),
    )
    # Periodic checkpoints kept (Detectron2's PeriodicCheckpointer max_to_keep): after each
    # periodic save the oldest model_NNNNNNN.pth files of OUTPUT_DIR beyond this many are
    # deleted; model_final.pth and the one last_checkpoint names are always kept. An
    # integer >= 0; 0 keeps all.
    declare(
        cfg,
        "SOLVER.CHECKPOINT_MAX_TO_KEEP",
        0,
        ("an integer >= 0 (0: keep all)", int_at_least(0)),
        lazy="checkpointer.max_to_keep",
    )

    cfg.SOLVER.LSR = CN()
    # Linear scaling rule with warmup (Goyal et al. 2017; LargeDet's first ingredient).
    # true: the peak learning rate (reached at the end of warmup) is computed from
    # REFERENCE_LR and REFERENCE_BATCH by RULE and replaces SOLVER.BASE_LR, which is
    # then unused; false: SOLVER.BASE_LR is the peak LR. Either way the LR is logged
    # at start and the schedule (SOLVER.LR_SCHEDULER_NAME, STEPS, GAMMA) multiplies it.
    # Warmup is Detectron2's: from WARMUP_FACTOR x LR to LR over SOLVER.WARMUP_ITERS
    # optimizer steps (SOLVER.WARMUP_METHOD).
    declare(cfg, "SOLVER.LSR.ENABLED", False, lazy="lsr.enabled")
    # How the peak LR grows with the global batch B: "linear": REFERENCE_LR x B /
    # REFERENCE_BATCH; "sqrt": REFERENCE_LR x sqrt(B / REFERENCE_BATCH) (a common
    # choice for adaptive optimizers such as LAMB).
    declare(cfg, "SOLVER.LSR.RULE", "linear", one_of(LSR_RULES), when=when_lsr, lazy="lsr.rule")
    # Global batch (images per optimizer step) at which REFERENCE_LR is known to work;
    # an integer >= 1.
    declare(
        cfg,
        "SOLVER.LSR.REFERENCE_BATCH",
        16,
        ("an integer >= 1", int_at_least(1)),
        when=when_lsr,
        lazy="lsr.reference_batch",
    )
    # Peak LR at REFERENCE_BATCH, in the optimizer's units (SGD: step size; LAMB and
    # PMD-LAMB: step relative to the weight norm); > 0. Detectron2's SGD uses 0.02 at 16.
    declare(
        cfg,
        "SOLVER.LSR.REFERENCE_LR",
        0.02,
        ("a number > 0", positive),
        when=when_lsr,
        lazy="lsr.reference_lr",
    )

    # Autocast dtype when SOLVER.AMP.ENABLED (Detectron2's switch): "float16" (with a
    # gradient scaler, unscaled once per optimizer step before clipping) or
    # "bfloat16" (no scaler; also on CPUs).
    declare(cfg, "SOLVER.AMP.PRECISION", "float16", lazy="amp.precision")
    # With True, autocast only where the device computes SOLVER.AMP.PRECISION in hardware
    # and run in float32 elsewhere (said at start): on x86 CPUs bfloat16 needs AVX512-BF16
    # or AMX-BF16 and float16 AVX512-FP16 or AMX-FP16; on Arm CPUs the BF16 or FP16
    # arithmetic extensions; on GPUs bfloat16 needs compute capability >= 8.0. Emulated
    # low precision is slower than float32 on a CPU.
    declare(cfg, "SOLVER.AMP.NATIVE_ONLY", False, lazy="amp.native_only")

    cfg.SOLVER.DIVERGENCE = CN()
    # Divergence guard. A step whose loss (total_loss averaged over devices and
    # micro-batches) is not finite always counts as divergence, and so does a step
    # whose gradient norm is not finite (that step is not taken; with the float16
    # gradient scaler the scaler skips it instead and it is no divergence). So does a spike: a
    # loss above SPIKE_FACTOR x the median loss of the previous WINDOW steps; a
    # float > 1, or 0 to disable the spike test.
    declare(
        cfg,
        "SOLVER.DIVERGENCE.SPIKE_FACTOR",
        10.0,
        ("0 (off) or a number > 1", spike_factor),
        lazy="divergence.spike_factor",
    )
    # Number of previous steps in the running median, an integer >= 1; the spike test
    # starts once min(WINDOW, 5) steps have been seen (the median of those seen until
    # there are WINDOW): the first steps of a run are watched too.
    declare(
        cfg,
        "SOLVER.DIVERGENCE.WINDOW",
        50,
        ("an integer >= 1", int_at_least(1)),
        lazy="divergence.window",
    )
    # What divergence does. false: stop with the loss dict and the last good
    # checkpoint in the error. true: restore the newest complete checkpoint (weights,
    # iteration, LR schedule, optimizer, gradient scaler, AGVM's mu; the data stream
    # goes on) and multiply the LR by ROLLBACK_LR_FACTOR; a run that diverges again before
    # a checkpoint past the one restored goes back to the one before it; stop when there is
    # no checkpoint (left) or after MAX_ROLLBACKS rollbacks in a run.
    declare(cfg, "SOLVER.DIVERGENCE.ROLLBACK", False, lazy="divergence.rollback")
    # Factor applied to the LR at each rollback, in (0, 1].
    declare(
        cfg,
        "SOLVER.DIVERGENCE.ROLLBACK_LR_FACTOR",
        0.5,
        ("a number in (0, 1]", lr_factor),
        lazy="divergence.rollback_lr_factor",
    )
    # Rollbacks allowed in a run (counted across resumes), an integer >= 0.
    declare(
        cfg,
        "SOLVER.DIVERGENCE.MAX_ROLLBACKS",
        3,
        ("an integer >= 0", int_at_least(0)),
        lazy="divergence.max_rollbacks",
    )

    # Re-seed Python's, NumPy's and torch's random number generators before every
    # optimizer step from (SEED, iteration, rank), and each training image's
    # augmentation from (SEED, its position in the data stream): true makes a resumed
    # run draw the same random numbers as an uninterrupted one, with any
    # DATALOADER.NUM_WORKERS and with aspect-ratio grouping (exact resume also needs
    # SEED >= 0 and the same number of processes and SOLVER.IMS_PER_DEVICE);
    # false: seeded once at start, as in Detectron2.
    declare(cfg, "RESEED_EVERY_ITER", False, lazy="reseed_every_iter")
    # Unreadable training images (truncated, not an image, missing) are skipped, logged
    # and counted (data/skipped_images); more than this many in a row in one loader
    # process stop the run with an error naming the last file.
    cfg.DATALOADER.MAX_CONSECUTIVE_SKIPS = 10
    # The most pixels (width x height, read from an image's header before it is decoded) of
    # an image that is trained or evaluated on, an integer >= 1; a larger one (a
    # decompression bomb: a few KB that decode to gigabytes) is skipped, logged and counted
    # as an unreadable one, in training, in evaluation and in the sample checked before
    # launch. The default is PIL's own default limit (Image.MAX_IMAGE_PIXELS); PIL refuses to
    # decode any image of more than twice that, whatever this key says.
    declare(
        cfg,
        "DATALOADER.MAX_IMAGE_PIXELS",
        89_478_485,  # PIL's default Image.MAX_IMAGE_PIXELS
        ("an integer >= 1 (pixels)", int_at_least(1)),
        lazy="max_image_pixels",
    )

    cfg.PREEMPTION = CN()
    # Signals that pre-empt a run: the current optimizer step finishes on every process,
    # the main process writes a checkpoint (weights, optimizer, LR schedule, data
    # position), the log says "pre-empted at iteration N: checkpoint <file>", and every
    # process exits with status 75; --resume continues at step N + 1. Names of catchable
    # signals; () leaves every signal's default action (SIGTERM kills the run at once).
    # SIGINT is Ctrl-C; loader workers ignore SIGTERM, SIGINT and these
    # (docs/reliability.md).
    cfg.PREEMPTION.SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")

    cfg.DISTRIBUTED = CN()
    # Seconds a collective of the process group (gloo or NCCL: the gradient all-reduce,
    # the losses' all-gather, a barrier) may wait for the other processes before it
    # fails, a number > 0; passed to torch.distributed.init_process_group. A lost
    # machine is detected within it: the survivors' step fails, each exits in one line
    # with status 69, and torchrun's elastic agent restarts them (docs/launching.md,
    # "Elastic runs"). torch's default is 30 minutes. It bounds every wait of one rank
    # for another, the other ranks' wait while the main process evaluates or writes a
    # checkpoint included: raise it where those take longer.
    declare(cfg, "DISTRIBUTED.TIMEOUT_S", 120.0, ("a number of seconds > 0", positive),
            lazy="distributed.timeout_s")  # fmt: skip

    # Optimizer steps between two writes of the logged metrics (console, metrics.json,
    # TensorBoard); an integer >= 1. Detectron2 writes every 20; short runs (a few dozen
    # large-batch steps) need fewer to draw their loss curves.
    declare(cfg, "LOG_PERIOD", 20, ("an integer >= 1", int_at_least(1)), lazy="log_period")

    # Sync-BN needs no key: a norm "SyncBN" (MODEL.RESNETS.NORM, MODEL.FPN.NORM, ...)
    # runs as torch's nn.SyncBatchNorm on GPUs and as Detectron2's NaiveSyncBatchNorm
    # on the CPU (largedet.layers); statistics are over one micro-batch on all devices.


def _add_ema_config(cfg: CN) -> None:
    # --- model EMA (largedet.engine.ema) -----------------------------------------
    cfg.MODEL_EMA = CN()
    # Keep an exponential moving average of the weights, updated once per optimizer
    # step (not per micro-batch): ema <- d ema + (1 - d) w, starting from the weights
    # training starts with; kept in checkpoints, restored by --resume; true or false.
    declare(cfg, "MODEL_EMA.ENABLED", False, lazy="model_ema.enabled")
    # d_ref: the decay per optimizer step at REFERENCE_BATCH images per step, in [0, 1).
    # A step of global batch B decays by d_ref ** (B / REFERENCE_BATCH) (the same decay
    # per image at any batch; Busbridge et al., NeurIPS 2023). 0.9998 at batch 16 is
    # 0.9873 per step at batch 1024: an average over ~80 steps.
    declare(
        cfg, "MODEL_EMA.DECAY", 0.9998, ("a number in [0, 1)", fraction), when=when_ema,
        lazy="model_ema.decay",
    )
    # Global batch (images per optimizer step) at which DECAY holds, an integer >= 1;
    # 0: DECAY is the per-step decay whatever the batch.
    declare(
        cfg,
        "MODEL_EMA.REFERENCE_BATCH",
        16,
        ("an integer >= 0 (0: DECAY per step)", int_at_least(0)),
        when=when_ema,
        lazy="model_ema.reference_batch",
    )
    # Floating-point buffers (BN's running mean and variance): "average" (averaged like
    # the weights) or "copy" (the model's, copied after each step). Integer buffers are
    # always copied.
    declare(
        cfg, "MODEL_EMA.BUFFERS", "average", one_of(BUFFER_MODES), when=when_ema,
        lazy="model_ema.buffers",
    )
    # What evaluations during and after training test: "ema" (the average; its results
    # are the run's), "model" (the trained weights) or "both" (the average's results,
    # and the trained weights' under model/<dataset>/... in the metrics). --eval-only on
    # a largedet checkpoint tests the average the checkpoint holds the same way.
    declare(
        cfg, "MODEL_EMA.EVAL", "ema", one_of(EMA_EVAL_MODES), when=when_ema, lazy="model_ema.eval"
    )


def _add_openimages_config(cfg: CN) -> None:
    # --- OpenImages (largedet.data.openimages, largedet.evaluation) --------------
    cfg.DATASETS.OPENIMAGES = CN()
    # Folder of the official files under their official names
    # (class-descriptions-boxable.csv, oidv6-train-annotations-bbox.csv, train/, ...;
    # see largedet.data.openimages.V6_SPLITS), registered as openimages_v6_{train,val,test}
    # and openimages_v6_challenge500_{train,val,test}. "" means
    # $LARGEDET_DATASETS/openimages or ~/.cache/largedet/datasets/openimages.
    cfg.DATASETS.OPENIMAGES.ROOT = ""
    # Folder of the parsed-annotation and image-size caches (built once, keyed on
    # the files' path, size and modification time). "" means
    # $LARGEDET_CACHE/openimages or ~/.cache/largedet/openimages.
    cfg.DATASETS.OPENIMAGES.CACHE_DIR = ""
    # Training annotations also carry each box for every ancestor class of the
    # hierarchy (a Dog box is also an Animal box): true or false. Use it or
    # TEST.OPENIMAGES.EXPAND_DETECTIONS, not both (that would duplicate detections).
    cfg.DATASETS.OPENIMAGES.EXPAND_HIERARCHY = False

    cfg.TEST.OPENIMAGES = CN()
    # Before the Open Images metric, copy every detection to each ancestor class
    # (same box and score): true or false. The challenge scores every level of the
    # hierarchy and does not expand detections itself; a detector trained on the
    # labels as annotated (DATASETS.OPENIMAGES.EXPAND_HIERARCHY false) needs this.
    cfg.TEST.OPENIMAGES.EXPAND_DETECTIONS = True


def _add_logging_config(cfg: CN) -> None:
    # --- Weights & Biases (largedet.engine.writers.WandbWriter) --------------------------
    cfg.WANDB = CN()
    # Also log the training scalars to Weights & Biases: everything metrics.json
    # gets (losses, lr, time, evaluation results, agvm/...), with the iteration as
    # the step, every LOG_PERIOD steps, from the main process only; the whole config
    # is the run's config. true or false. Needs `pip install wandb` (an error naming
    # this key otherwise). A resumed run (--resume) starts a new W&B run.
    declare(cfg, "WANDB.ENABLED", False, lazy="wandb.enabled")
    # W&B project the run goes to.
    declare(cfg, "WANDB.PROJECT", "largedet", lazy="wandb.project")
    # Run name; "" means the last folder of OUTPUT_DIR.
    declare(cfg, "WANDB.NAME", "", lazy="wandb.name")
    # W&B team or user (wandb's "entity"); "" means the account's default.
    declare(cfg, "WANDB.ENTITY", "", lazy="wandb.entity")
    # wandb.init's mode: "online", "offline" (files only, under OUTPUT_DIR/wandb;
    # upload later with `wandb sync`) or "disabled"; "" leaves it to wandb
    # ($WANDB_MODE, else "online").
    declare(cfg, "WANDB.MODE", "", one_of(("", "online", "offline", "disabled")), lazy="wandb.mode")


def _add_extension_config(cfg: CN) -> None:
    # --- the user's own modules (largedet.config.imports; docs/extend.md) ---------------
    # Python modules imported before the config is checked and in every process of the job,
    # after sys.path and the working directory, e.g. ["my_ext"]: modules that register an
    # optimizer, a dataset, an evaluator, a model part or a hook that the config names.
    # The scripts' --import MODULE flags add to them.
    declare(cfg, "IMPORTS", [], lazy="imports")
    # Hooks added to the trainer's, by their names in largedet.engine.HOOK_REGISTRY, in
    # order, after largedet's own and before the run summary; each is built as
    # builder(cfg). Names a module of IMPORTS registered, e.g. ["MyHook"]; checked before
    # launch.
    declare(cfg, "HOOKS", [], lazy="hooks")


# the declarations of every key (largedet.config.keys), made once at import
add_largedet_config(get_cfg())
