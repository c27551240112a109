"""``add_video_config(cfg)``: every key the video project adds to Detectron2's config.

It first adds largedet's keys (optimizers, LSR, Sync-BN) with
``add_largedet_config``. Each key below is commented where it is defined:
meaning, unit, scope and allowed values. Derived numbers (clips per device,
epochs, scaled LR) are computed and logged at start, never stored here.
"""

from detectron2.config import CfgNode as CN
from detectron2.config import get_cfg as _get_cfg
from largedet.config import add_largedet_config
from largedet.config.keys import KeyRegistry, declare, int_at_least, one_of

__all__ = ["VIDEO_KEYS", "add_video_config"]

#: The video keys' value rules (each declared with its key below, by largedet's
#: :func:`~largedet.config.keys.declare`), checked before launch for training and evaluation;
#: largedet's own checks never see them. A key that names a part of another room (a ResNet
#: depth, a decoder) has its rule in that room (:mod:`largedet_video.engine.checks`).
VIDEO_KEYS = KeyRegistry()


def add_video_config(cfg: CN) -> CN:
    """Add largedet's and the video project's keys (with defaults) to ``cfg``, in
    place; returns it."""
    add_largedet_config(cfg)
    _add_model_config(cfg)
    _add_input_config(cfg)
    _add_data_config(cfg)
    _add_test_config(cfg)
    _add_runtime_config(cfg)
    _add_multigrid_config(cfg)
    return cfg


def _add_model_config(cfg: CN) -> None:
    # The clip classifier (largedet_video.modeling.VideoClassifier).
    cfg.MODEL.META_ARCHITECTURE = "VideoClassifier"
    # RGB mean and std on the 0-255 scale (ImageNet's, as torchvision's weights expect).
    cfg.MODEL.PIXEL_MEAN = [123.675, 116.28, 103.53]
    cfg.MODEL.PIXEL_STD = [58.395, 57.12, 57.375]

    cfg.MODEL.VIDEO = CN()
    # Backbone, by name in VIDEO_BACKBONE_REGISTRY: "TSMResNet" (2D ResNet with the
    # temporal shift), "TSNResNet" (the same without it), "I3DResNet" (3D baseline).
    cfg.MODEL.VIDEO.BACKBONE = "TSMResNet"
    # Number of classes K (400 for Kinetics-400).
    declare(cfg, "MODEL.VIDEO.NUM_CLASSES", 400, ("an integer >= 1", int_at_least(1)), registry=VIDEO_KEYS)
    # Dropout probability before the classifier; 0 disables it.
    cfg.MODEL.VIDEO.DROPOUT = 0.5
    # Batch norm of the backbone: "BN" (per device) or "SyncBN" (statistics over
    # all devices: nn.SyncBatchNorm on GPUs, Detectron2's NaiveSyncBatchNorm on the CPU).
    declare(cfg, "MODEL.VIDEO.NORM", "BN", one_of(("BN", "SyncBN")), registry=VIDEO_KEYS)
    # Local path of a torchvision-format ImageNet ResNet state dict to start the
    # backbone from ("" = random init). 2D kernels are inflated for I3D. Never
    # downloaded. (MODEL.WEIGHTS is a whole-model checkpoint, loaded after this.)
    cfg.MODEL.VIDEO.PRETRAINED = ""

    cfg.MODEL.VIDEO.RESNET = CN()
    # ResNet depth: 10, 18, 34, 50, 101 or 152 (I3D: 50, 101 or 152).
    cfg.MODEL.VIDEO.RESNET.DEPTH = 50
    # Channels of the stem and first stage (64 in ResNet; smaller for tiny models).
    cfg.MODEL.VIDEO.RESNET.WIDTH = 64
    # Start every residual block as the identity (last BN's gamma = 0).
    cfg.MODEL.VIDEO.RESNET.ZERO_INIT_RESIDUAL = False

    cfg.MODEL.VIDEO.TSM = CN()
    # Fold divisor: 1/SHIFT_DIV of the channels shift back in time, 1/SHIFT_DIV
    # forward, the rest stay (8 in the TSM paper).
    cfg.MODEL.VIDEO.TSM.SHIFT_DIV = 8
    # Shift in every SHIFT_EVERY-th block of each stage; 0 = TSM's choice
    # (every block up to ResNet-50, every other block from ResNet-101 on).
    cfg.MODEL.VIDEO.TSM.SHIFT_EVERY = 0
    # Implementation of the shift, the same values and gradients from each: "triton" (one
    # Triton kernel per direction on CUDA tensors; "slices" elsewhere or without Triton),
    # "slices" (eager slice copies, runs everywhere), "compiled" (torch.compile'd). Speed:
    # projects/video/benchmarks/shift_cost.py; on an H100 "triton" was the fastest.
    cfg.MODEL.VIDEO.TSM.SHIFT_IMPL = "triton"

    cfg.MODEL.VIDEO.I3D = CN()
    # I3D variant: "3x3x3" (inflated 3x3 convs, temporal pooling) or "3x1x1"
    # (3x1x1 convs in res4-res5, no temporal pooling).
    cfg.MODEL.VIDEO.I3D.VARIANT = "3x3x3"


def _add_input_config(cfg: CN) -> None:
    # Frames are decoded as RGB.
    cfg.INPUT.FORMAT = "RGB"

    cfg.INPUT.VIDEO = CN()
    # Frames per clip, T (TSM's segments).
    declare(cfg, "INPUT.VIDEO.NUM_FRAMES", 8, ("an integer >= 1", int_at_least(1)), registry=VIDEO_KEYS)
    # Frame sampling: "segment" (TSN: the video cut into T equal segments, one
    # frame from each, random in training, centred at test) or "dense" (T frames
    # DENSE_STRIDE apart from a random start in training, evenly spread starts at test).
    cfg.INPUT.VIDEO.SAMPLING = "segment"
    # Frames between consecutive samples with SAMPLING "dense".
    cfg.INPUT.VIDEO.DENSE_STRIDE = 8
    # Side of the square training crop, pixels.
    cfg.INPUT.VIDEO.TRAIN_CROP_SIZE = 224
    # TSN's multi-scale crop: crop width and height are each a scale from this
    # list times the frame's short side, then resized to TRAIN_CROP_SIZE.
    cfg.INPUT.VIDEO.TRAIN_SCALES = [1.0, 0.875, 0.75, 0.66]
    # Most steps apart in TRAIN_SCALES that the width and height scales may be
    # (limits the aspect-ratio distortion; 1 in TSN).
    cfg.INPUT.VIDEO.MAX_DISTORT = 1
    # Random horizontal flip in training. Off for data whose labels depend on
    # left/right motion.
    cfg.INPUT.VIDEO.FLIP = True
    # Test: frames are resized so their short side is TEST_SHORT_SIDE, then
    # TEST_NUM_CROPS square crops of TEST_CROP_SIZE (1: centre; 3: both ends and
    # the centre of the long side) are taken from each of TEST_NUM_CLIPS clips.
    cfg.INPUT.VIDEO.TEST_SHORT_SIDE = 256
    cfg.INPUT.VIDEO.TEST_CROP_SIZE = 224
    cfg.INPUT.VIDEO.TEST_NUM_CLIPS = 10
    cfg.INPUT.VIDEO.TEST_NUM_CROPS = 3
    # Video decoder (largedet_video.data.decoding), in each DataLoader worker:
    # "pyav" (PyAV), "opencv" (OpenCV), "torchcodec" (torchcodec on the CPU) or
    # "torchcodec_cuda" (torchcodec on the GPU's NVDEC, frames copied back to the
    # host; needs DATALOADER.NUM_WORKERS 0, since CUDA cannot start in forked
    # workers). All give the same frames for the same indices (frame-exact) and
    # skip corrupt files alike. torchcodec needs `pip install torchcodec` and
    # FFmpeg 4-9's shared libraries. Folders of JPEG frames need no decoder.
    cfg.INPUT.VIDEO.DECODER = "pyav"
    # MB of whole decoded videos each loader process keeps in memory (0: none). A video
    # is decoded whole on its first read and its later clips come from memory, until
    # the budget is spent; then the rest are decoded on every read as without it. The
    # clips are the same either way. For datasets of small videos that fit (a video
    # of F frames of H x W takes F*H*W*3 bytes; each DataLoader worker holds its own).
    declare(cfg, "INPUT.VIDEO.DECODED_CACHE_MB", 0, ("an integer >= 0", int_at_least(0)), registry=VIDEO_KEYS)


def _add_data_config(cfg: CN) -> None:
    # Batches each DataLoader worker prepares ahead (torch's prefetch_factor).
    cfg.DATALOADER.PREFETCH_FACTOR = 2
    # Seconds to wait for one batch from the workers before failing (0 = forever).
    cfg.DATALOADER.TIMEOUT = 300
    # (DATALOADER.MAX_CONSECUTIVE_SKIPS, from largedet's config: a training sample whose
    # video cannot be read is replaced by the next index; after that many unreadable
    # videos in a row the loader raises.)

    # Extra datasets from list files: a list of [name, list_file, root] triples.
    # list_file holds "path label" (or "path num_frames label") lines, or is an
    # official Kinetics CSV; paths are relative to root. Each is registered
    # under its name for DATASETS.TRAIN / DATASETS.TEST.
    cfg.DATASETS.VIDEO_LISTS = []

    # --- built-in moving-shapes videos (largedet_video.data.moving_shapes) -------
    cfg.DATASETS.MOVING_SHAPES = CN()
    # Cache folder; "" means $LARGEDET_DATASETS or ~/.cache/largedet/datasets.
    cfg.DATASETS.MOVING_SHAPES.ROOT = ""
    # Videos in the training / validation split.
    cfg.DATASETS.MOVING_SHAPES.NUM_TRAIN = 800
    cfg.DATASETS.MOVING_SHAPES.NUM_VAL = 200
    # Frames per video.
    cfg.DATASETS.MOVING_SHAPES.NUM_FRAMES = 32
    # Frame width and height, pixels (even, for yuv420p).
    cfg.DATASETS.MOVING_SHAPES.WIDTH = 96
    cfg.DATASETS.MOVING_SHAPES.HEIGHT = 72
    # Seed of the generator: the same seed gives the same videos.
    cfg.DATASETS.MOVING_SHAPES.SEED = 0
    # "direction" (4 classes: the way the shape moves) or "direction_speed" (8: each
    # direction slow or fast, with camera shake; the batch study's task with headroom).
    cfg.DATASETS.MOVING_SHAPES.TASK = "direction"
    # Speeds of the moving shape in pixels per frame, (min, max): SPEED for the
    # "direction" task and the fast classes, SLOW_SPEED for the slow classes.
    cfg.DATASETS.MOVING_SHAPES.SPEED = (3.0, 4.0)
    cfg.DATASETS.MOVING_SHAPES.SLOW_SPEED = (1.0, 1.5)
    # Radius of every shape in pixels, (min, max).
    cfg.DATASETS.MOVING_SHAPES.RADIUS = (5.0, 9.0)
    # Camera shake: the largest shift of a whole frame in pixels (0: none).
    cfg.DATASETS.MOVING_SHAPES.JITTER = 0.0
    # Standard deviation of the per-pixel noise (0-255 scale).
    cfg.DATASETS.MOVING_SHAPES.NOISE = 6.0
    # A held-out split to choose a recipe on, registered as "moving_shapes_holdout_val":
    # HOLDOUT_NUM_VAL videos of the same generator with seed HOLDOUT_SEED (its training
    # split is one unused video). 0: not registered.
    cfg.DATASETS.MOVING_SHAPES.HOLDOUT_NUM_VAL = 0
    cfg.DATASETS.MOVING_SHAPES.HOLDOUT_SEED = 1000

    # --- Kinetics-400 (largedet_video.data.builtin) --------------------------------
    cfg.DATASETS.KINETICS = CN()
    # Root holding annotations/{train,validate}.csv and the videos under
    # train/ and val/ (flat or one folder per class); "" means
    # $LARGEDET_DATASETS/kinetics400.
    cfg.DATASETS.KINETICS.ROOT = ""


def _add_runtime_config(cfg: CN) -> None:
    # torch's intra-op threads per process on the CPU; 0 keeps torch's default
    # (one per core). On a small or shared machine, one thread per process
    # leaves cores to the data loader workers and to other processes, and
    # avoids threads that spin waiting for a busy core.
    cfg.CPU_THREADS = 0


def _add_test_config(cfg: CN) -> None:
    # Videos per device in one test batch (each with TEST_NUM_CLIPS x
    # TEST_NUM_CROPS views).
    declare(cfg, "TEST.VIDEOS_PER_BATCH", 1, ("an integer >= 1", int_at_least(1)), registry=VIDEO_KEYS)


def _add_multigrid_config(cfg: CN) -> None:
    # Multigrid training (Wu et al., CVPR 2020; largedet_video.multigrid): mini-batch
    # shapes (clips x frames x crop) on a schedule, coarse shapes with more clips and a
    # larger LR early, the base shape late. On when LONG_CYCLE or SHORT_CYCLE is on.
    # The base shape is SOLVER.IMS_PER_DEVICE (or IMS_PER_BATCH / devices) clips of
    # INPUT.VIDEO.NUM_FRAMES frames of INPUT.VIDEO.TRAIN_CROP_SIZE pixels, per device.
    # The base schedule must be a step schedule (SOLVER.LR_SCHEDULER_NAME
    # "WarmupMultiStepLR"): SOLVER.STEPS and SOLVER.MAX_ITER, in optimizer steps at the
    # base global batch, give its LR-stage epochs and length (rounded to whole epochs of
    # the first training dataset); SOLVER.GAMMA is its decay. The multigrid run's
    # iteration count, stage ends and LRs are derived from them and logged at start.
    cfg.MULTIGRID = CN()
    # The long cycle: each LR stage of the base schedule cycles through the shapes
    # of LONG_CYCLE_FACTORS, then a fine-tuning stage runs at the base shape.
    cfg.MULTIGRID.LONG_CYCLE = False
    # The short cycle: inside each stage, iterations alternate over smaller crops
    # (SHORT_CYCLE_FACTORS) and the stage's own crop, one iteration each.
    cfg.MULTIGRID.SHORT_CYCLE = False
    # (time, space) factors of the long-cycle shapes relative to the base (T, S):
    # t = round(T * time), s = round(S * space); each at most 1. The paper's default.
    cfg.MULTIGRID.LONG_CYCLE_FACTORS = [
        [0.25, 0.5**0.5],
        [0.5, 0.5**0.5],
        [0.5, 1.0],
        [1.0, 1.0],
    ]
    # Crops of the short cycle's first shapes, as fractions of the base crop S (not
    # of the stage's crop); the last shape of each short cycle is the stage's own.
    cfg.MULTIGRID.SHORT_CYCLE_FACTORS = [0.5, 0.5**0.5]
    # Length of the multigrid schedule in data epochs, as a multiple of the base
    # schedule's (1.5 in the paper; 1.0 keeps the base epoch budget).
    cfg.MULTIGRID.EPOCH_FACTOR = 1.5
    # The long cycle's LR grows with its shape's clips per step (the linear scaling rule,
    # the paper's); False holds the base shape's LR at every shape.
    cfg.MULTIGRID.SCALE_LR = True
    # Clips per BN group: batch statistics over fixed groups of this many clips,
    # whatever the per-device batch (sub-batch BN, one shared affine; synchronized
    # over enough devices where one holds fewer clips). 0 keeps MODEL.VIDEO.NORM
    # as it is. Used only when multigrid is on. 8 in the paper.
    declare(cfg, "MULTIGRID.BN_BASE_SIZE", 8, ("an integer >= 0", int_at_least(0)), registry=VIDEO_KEYS)


# Declare the keys (and their rules in VIDEO_KEYS) once, when this module is imported.
add_video_config(_get_cfg())
