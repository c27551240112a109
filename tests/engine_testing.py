"""Shared pieces of the engine tests: a tiny registered detector and configs around it.

``LargeDetTinyDetector`` has per-image losses averaged over the batch (no batch
statistics with GN or FrozenBN), so K micro-batches of B images have exactly the
gradient of one batch of K*B images, and it draws no random numbers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket

import torch
import torch.nn.functional as F
from torch import nn

from detectron2.config import get_cfg
from detectron2.engine import HookBase
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.structures import Boxes, Instances
from largedet.config import add_largedet_config

NUM_CLASSES = 3


def _norm(kind: str, channels: int) -> nn.Module:
    return {
        "GN": lambda: nn.GroupNorm(4, channels),
        "FrozenBN": lambda: FrozenBatchNorm2d(channels),
        "BN": lambda: nn.BatchNorm2d(channels),
        "SyncBN": lambda: nn.SyncBatchNorm(channels),
    }[kind]()


@META_ARCH_REGISTRY.register()
class LargeDetTinyDetector(nn.Module):
    """Predicts each image's mean box (normalized) and which classes it shows.

    Two convs (norm ``MODEL.RESNETS.NORM``, then FrozenBN), global pooling and a linear
    layer; ``loss_box`` (smooth L1) and ``loss_cls`` (binary cross-entropy) are means over
    images. ``loss_scale`` multiplies both (the tests use it to make a step diverge).
    """

    def __init__(self, cfg):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm1 = _norm(cfg.MODEL.RESNETS.NORM, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.norm2 = FrozenBatchNorm2d(8)
        self.norm2.weight.copy_(torch.linspace(0.5, 1.5, 8))
        self.norm2.running_mean.copy_(torch.linspace(-0.2, 0.2, 8))
        self.head = nn.Linear(8, 4 + NUM_CLASSES)
        self.loss_scale = 1.0
        self.to(torch.device(cfg.MODEL.DEVICE))

    @property
    def device(self):
        return self.head.weight.device

    def forward(self, batched_inputs):
        images = torch.stack([d["image"] for d in batched_inputs]).to(self.device).float() / 255.0
        x = F.relu(self.norm1(self.conv1(images)))
        x = F.relu(self.norm2(self.conv2(x)))
        out = self.head(x.mean(dim=(2, 3)))
        box_targets, cls_targets = [], []
        for d in batched_inputs:
            inst = d["instances"]
            h, w = d["image"].shape[-2:]
            box_targets.append(inst.gt_boxes.tensor.mean(dim=0) / torch.tensor([w, h, w, h]))
            cls_targets.append(F.one_hot(inst.gt_classes, NUM_CLASSES).amax(dim=0).float())
        box_t = torch.stack(box_targets).to(self.device)
        cls_t = torch.stack(cls_targets).to(self.device)
        loss_box = F.smooth_l1_loss(out[:, :4].float(), box_t, reduction="none").sum(1).mean()
        loss_cls = (
            F.binary_cross_entropy_with_logits(out[:, 4:].float(), cls_t, reduction="none")
            .sum(1)
            .mean()
        )
        return {"loss_box": loss_box * self.loss_scale, "loss_cls": loss_cls * self.loss_scale}


def synthetic_batch(n: int, seed: int, size: int = 32):
    """``n`` mapped dataset dicts (uint8 CHW images with 1-3 boxes each), deterministic."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        image = torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)
        k = int(torch.randint(1, 4, (1,), generator=g))
        xy = torch.rand(k, 2, generator=g) * size / 2
        wh = torch.rand(k, 2, generator=g) * size / 2 + 1
        inst = Instances((size, size))
        inst.gt_boxes = Boxes(torch.cat([xy, xy + wh], dim=1))
        inst.gt_classes = torch.randint(0, NUM_CLASSES, (k,), generator=g)
        out.append({"image": image, "instances": inst})
    return out


def tiny_cfg(output_dir: str, *opts):
    """A config for :class:`LargeDetTinyDetector` on the ``tiny_shapes`` dataset (64 px),
    single-process SGD; ``opts`` are ``KEY VALUE`` overrides."""
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.META_ARCHITECTURE = "LargeDetTinyDetector"
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.RESNETS.NORM = "GN"
    cfg.DATASETS.TRAIN = ("tiny_shapes_train",)
    cfg.DATASETS.TEST = ()
    cfg.INPUT.MIN_SIZE_TRAIN = (64,)
    cfg.INPUT.MAX_SIZE_TRAIN = 64
    cfg.INPUT.RANDOM_FLIP = "none"
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.OPTIMIZER = "SGD"
    cfg.SOLVER.BASE_LR = 0.1
    cfg.SOLVER.MOMENTUM = 0.9
    cfg.SOLVER.WEIGHT_DECAY = 1e-4
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SOLVER.MAX_ITER = 4
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.WARMUP_FACTOR = 0.5
    cfg.SOLVER.STEPS = ()
    cfg.SOLVER.CHECKPOINT_PERIOD = 1000
    cfg.SEED = 0
    cfg.OUTPUT_DIR = output_dir
    cfg.merge_from_list(list(opts))
    cfg.freeze()
    return cfg


def weights(model: nn.Module):
    """name -> a copy of each parameter and buffer (DDP's ``module.`` prefix removed)."""
    model = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_abs_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return (
        max((a[k].float() - b[k].float()).abs().max().item() for k in a if a[k].numel())
        if a
        else math.nan
    )


class StopAt(HookBase):
    """Simulates a kill: raises before iteration ``at`` starts."""

    def __init__(self, at):
        self.at = at

    def before_step(self):
        if self.trainer.iter == self.at:
            raise KeyboardInterrupt(f"killed before iteration {self.at}")


def straight_and_killed(make_cfg, tmp_path, stop_at: int, last_checkpoint: str):
    """The kill-and-resume scenario: a run trained straight through (``tmp_path/straight``),
    and the same run (``tmp_path/killed``) killed before step ``stop_at``, whose last
    checkpoint must be ``last_checkpoint``, then built again in another process state
    (``seed_all_rng(1)``: everything must come from the checkpoint) and resumed, not yet
    trained. ``make_cfg(output_dir)``: the run's config. Returns ``(straight, resumed,
    initial)``, ``initial`` the straight run's weights before training."""
    import pytest
    from detectron2.utils.env import seed_all_rng

    from largedet.engine import Trainer

    seed_all_rng(0)
    straight = Trainer(make_cfg(tmp_path / "straight"))
    initial = weights(straight.model)
    straight.resume_or_load(resume=False)
    straight.train()

    out = tmp_path / "killed"
    seed_all_rng(0)
    first = Trainer(make_cfg(out))
    first.register_hooks([StopAt(stop_at)])
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    assert (out / "last_checkpoint").read_text() == last_checkpoint

    seed_all_rng(1)
    resumed = Trainer(make_cfg(out))
    resumed.resume_or_load(resume=True)
    return straight, resumed, initial


@contextlib.contextmanager
def largedet_log(caplog):
    """Within the block, largedet's INFO and higher log records reach ``caplog`` (its logger
    does not propagate once Detectron2's ``setup_logger`` has set it up)."""
    logger = logging.getLogger("largedet")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False  # each record reaches caplog's handler once, set up or not
    try:
        with caplog.at_level(logging.INFO, logger="largedet"):
            yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_two_processes(fn, tiny_shapes, out_dir):
    """Run ``fn(tiny_shapes, out_dir/run, result_file)`` on two gloo processes (Detectron2's
    ``launch``) and return what rank 0 saved to ``result_file`` with ``torch.save``."""
    from detectron2.engine import launch

    result_file = str(out_dir / "result.pth")
    launch(fn, 2, dist_url=f"tcp://127.0.0.1:{_free_port()}",
           args=(tiny_shapes, str(out_dir / "run"), result_file))  # fmt: skip
    return torch.load(result_file, weights_only=False)
