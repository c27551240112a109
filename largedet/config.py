"""``add_largedet_config(cfg)``: every key largedet adds to Detectron2's config.

Each key is commented where it is defined: meaning, unit, scope (per device or
global), allowed values and the paper's symbol. Derived values (accumulation
steps, scaled LR) are never stored here; they are computed and logged at start.
"""

from detectron2.config import CfgNode as CN


def add_largedet_config(cfg: CN) -> CN:
    """Add largedet's keys (with defaults) to a Detectron2 config, in place; returns it."""
    _add_data_config(cfg)
    _add_solver_config(cfg)
    _add_large_batch_config(cfg)
    _add_openimages_config(cfg)
    return cfg


def _add_data_config(cfg: CN) -> None:
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


def _add_solver_config(cfg: CN) -> None:
    # --- optimizers (largedet.optim, largedet.solver) ----------------------------
    # Optimizer, by its name in largedet.solver.OPTIMIZER_REGISTRY: "SGD", "AdamW",
    # "LAMB", "PMD_LAMB", "LARS", or a name a user registered there. All use
    # SOLVER.BASE_LR and SOLVER.WEIGHT_DECAY; SGD and LARS also SOLVER.MOMENTUM.
    cfg.SOLVER.OPTIMIZER = "SGD"
    # Multi-tensor (torch._foreach_*) optimizer step: true (fast) or false (a loop
    # over parameter tensors; the same numbers for LAMB, PMD_LAMB and LARS).
    cfg.SOLVER.FOREACH = True
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
    cfg.SOLVER.LAMB.BETAS = (0.9, 0.999)
    # eps of LAMB and PMD_LAMB, added to sqrt(v_t / b_t) in the update's
    # denominator; > 0, in units of the gradient.
    cfg.SOLVER.LAMB.EPS = 1e-6
    # Upper clamp of the layer-wise trust ratio ||w|| / ||x|| of LAMB and PMD_LAMB;
    # > 0, or None for no clamp.
    cfg.SOLVER.LAMB.MAX_TRUST_RATIO = 10.0

    cfg.SOLVER.PMD = CN()
    # Period T of PMD_LAMB's moment decay, in optimizer steps (iterations); an
    # integer >= 1. Within each period the moments' decay coefficient gamma falls
    # from 1 towards 0, then restarts.
    cfg.SOLVER.PMD.PERIOD = 200
    # Shape d(u) of gamma over the position u in [0, 1) inside a period:
    # "cosine" ((1 + cos(pi u)) / 2), "linear" (1 - u) or "none" (1: plain LAMB).
    cfg.SOLVER.PMD.DECAY = "cosine"

    cfg.SOLVER.LARS = CN()
    # Trust coefficient eta of LARS: trust = eta ||w|| / (||g|| + lambda ||w||); > 0.
    cfg.SOLVER.LARS.ETA = 0.001


def _add_large_batch_config(cfg: CN) -> None:
    # --- global batch, accumulation, LSR, warm-up, Sync-BN (largedet.engine) ------
    pass


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
