"""Faster R-CNN R18-FPN on the built-in shapes dataset with PMD-LAMB at global batch 1024, as a
LazyConfig; the same run as ``configs/shapes/faster_rcnn_R18_FPN_pmdlamb_bs1024.yaml``.

    python tools/lazyconfig_train_net.py --config configs/shapes/lazy/faster_rcnn_R18_FPN_pmdlamb_bs1024.py --num-gpus 8

Iterations: 300 optimizer steps x 1024 images = 307,200 images = 204.8 epochs of the 1,500
training images. Batch 1024 = 8 devices x 16 images x 8 accumulated micro-batches (on one
device: 64 micro-batches of 16). LR: the square-root scaling rule from 0.005 at batch 16,
0.005 x sqrt(1024 / 16) = 0.04, reached after a 60-step warm-up (61,440 images) from
0.001 x LR; x0.1 at steps 225 and 275 (3/4 and 11/12 of the run); PMD-LAMB period T = 75
steps (four periods in the run). These are the settings that trained at batch 1024 in the
large-batch study (LR 0.04 with 60 warm-up steps, T 75; the square-root rule's 0.08 with a
short warm-up diverged), on its smaller R10w16 detector at 64 px; this R18 run at 128 px has
not been trained to the end here (at about 23 images/s on the 2-core CPU it would take
3.7 hours).
"""

from fvcore.common.param_scheduler import MultiStepParamScheduler

from detectron2.config import LazyCall as L
from largedet.config.lazy import train_defaults
from largedet.optim import PMDLAMB
from largedet.solver import optimizer_param_groups

from .base_shapes_r18_fpn import dataloader, datasets, model  # noqa: F401

# PMD-LAMB (largedet.optim.PMDLAMB). lr is replaced by the LSR's peak LR (train.lsr), and
# params.base_lr follows it; no weight decay and no trust ratio for biases and norm layers
# (layer_adaptive, adapt_norm / adapt_bias False), as SOLVER.ADAPT_NORM / ADAPT_BIAS.
optimizer = L(PMDLAMB)(
    params=L(optimizer_param_groups)(
        base_lr="${..lr}",
        weight_decay="${..weight_decay}",
        weight_decay_norm=0.0,
        weight_decay_bias=0.0,
        layer_adaptive=True,
        adapt_norm=False,
        adapt_bias=False,
    ),
    lr=0.04,
    weight_decay=1e-4,
    period=75,  # T, in optimizer steps
    decay="cosine",
)

# The multiplier of the peak LR over the run (the warm-up, train.warmup, replaces its
# start): x0.1 at each milestone (SOLVER.GAMMA 0.1), as the yacs path computes it.
lr_multiplier = L(MultiStepParamScheduler)(
    values=[0.1**k for k in range(3)],
    milestones=[225, 275],
    num_updates="${train.max_iter}",
)

train = train_defaults()
train.update(
    output_dir="output/shapes_lazy_faster_rcnn_R18_FPN_pmdlamb_bs1024",
    device="auto",  # cuda where torch finds a GPU, else cpu (logged)
    seed=0,
    max_iter=300,
    ims_per_batch=1024,  # global batch B: images per optimizer step, all devices
    ims_per_device=16,  # micro-batch: images one device holds per pass
    checkpointer=dict(period=75),
    eval_period=0,  # evaluate once, at the end
)
train["lsr"].update(enabled=True, rule="sqrt", reference_batch=16, reference_lr=0.005)
train["warmup"].update(iters=60, factor=0.001)
