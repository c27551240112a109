"""The shapes detector of ``configs/shapes/Base-Shapes-R18-FPN.yaml`` as a LazyConfig: the
same Faster R-CNN (ResNet-18 with BN and nothing frozen, a 64-channel FPN, a 256-wide box
head, anchors of 8-128 px, 3 classes), the same data (the generated shapes set, 128x128
images, horizontal flips) and evaluation. Built from the same arguments it is the same
network as the yaml's, parameter for parameter (tests/config/test_lazy.py).

Leaf configs import ``model``, ``dataloader`` and ``datasets`` from here and add
``optimizer``, ``lr_multiplier`` and ``train`` (see faster_rcnn_R18_FPN_pmdlamb_bs1024.py).
"""

from omegaconf import OmegaConf

import detectron2.data.transforms as T
from detectron2.config import LazyCall as L
from detectron2.data import (
    DatasetMapper,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detectron2.layers import ShapeSpec
from detectron2.modeling.anchor_generator import DefaultAnchorGenerator
from detectron2.modeling.backbone import FPN, BasicStem, ResNet
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.matcher import Matcher
from detectron2.modeling.meta_arch import GeneralizedRCNN
from detectron2.modeling.poolers import ROIPooler
from detectron2.modeling.proposal_generator import RPN, StandardRPNHead
from detectron2.modeling.roi_heads import FastRCNNConvFCHead, FastRCNNOutputLayers, StandardROIHeads

from largedet.data import ShapesSpec, register_shapes

# Datasets registered (each entry instantiated) in every process before any loader is
# built: the generated shapes set as "shapes_train" / "shapes_val" (DATASETS.SHAPES.*:
# image counts, side in pixels, generator seed, cache folder; "" = $LARGEDET_DATASETS or
# ~/.cache/largedet/datasets).
datasets = dict(
    shapes=L(register_shapes)(
        spec=L(ShapesSpec)(num_train=1500, num_val=150, image_size=128, seed=0, root=""),
        prefix="shapes",
    )
)

model = L(GeneralizedRCNN)(
    backbone=L(FPN)(
        bottom_up=L(ResNet)(
            stem=L(BasicStem)(in_channels=3, out_channels=64, norm="BN"),
            stages=L(ResNet.make_default_stages)(depth=18, norm="BN"),
            out_features=["res2", "res3", "res4", "res5"],
            freeze_at=0,
        ),
        in_features=["res2", "res3", "res4", "res5"],
        out_channels=64,
        top_block=L(LastLevelMaxPool)(),
    ),
    proposal_generator=L(RPN)(
        in_features=["p2", "p3", "p4", "p5", "p6"],
        head=L(StandardRPNHead)(in_channels=64, num_anchors=3),
        anchor_generator=L(DefaultAnchorGenerator)(
            sizes=[[8], [16], [32], [64], [128]],
            aspect_ratios=[0.5, 1.0, 2.0],
            strides=[4, 8, 16, 32, 64],
            offset=0.0,
        ),
        anchor_matcher=L(Matcher)(
            thresholds=[0.3, 0.7], labels=[0, -1, 1], allow_low_quality_matches=True
        ),
        box2box_transform=L(Box2BoxTransform)(weights=[1.0, 1.0, 1.0, 1.0]),
        batch_size_per_image=64,  # anchors sampled per image
        positive_fraction=0.5,
        pre_nms_topk=(500, 500),  # (training, test), per FPN level
        post_nms_topk=(200, 200),
        nms_thresh=0.7,
    ),
    roi_heads=L(StandardROIHeads)(
        num_classes=3,
        batch_size_per_image=64,  # RoIs sampled per image
        positive_fraction=0.25,
        proposal_matcher=L(Matcher)(
            thresholds=[0.5], labels=[0, 1], allow_low_quality_matches=False
        ),
        box_in_features=["p2", "p3", "p4", "p5"],
        box_pooler=L(ROIPooler)(
            output_size=7,
            scales=(1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32),
            sampling_ratio=0,
            pooler_type="ROIAlignV2",
        ),
        box_head=L(FastRCNNConvFCHead)(
            input_shape=ShapeSpec(channels=64, height=7, width=7),
            conv_dims=[],
            fc_dims=[256, 256],
        ),
        box_predictor=L(FastRCNNOutputLayers)(
            input_shape=ShapeSpec(channels=256),
            test_score_thresh=0.05,
            box2box_transform=L(Box2BoxTransform)(weights=(10, 10, 5, 5)),
            num_classes="${..num_classes}",
        ),
    ),
    pixel_mean=[103.530, 116.280, 123.675],
    pixel_std=[57.375, 57.120, 58.395],
    input_format="BGR",
)

# The training loader is largedet's (resumable, unreadable images skipped), built from the
# dataset names, mapper, workers and grouping given here; its batch is train.ims_per_device
# images per device (the global batch is train.ims_per_batch), so no total_batch_size here.
dataloader = OmegaConf.create()
dataloader.train = L(build_detection_train_loader)(
    dataset=L(get_detection_dataset_dicts)(names="shapes_train"),
    mapper=L(DatasetMapper)(
        is_train=True,
        augmentations=[
            L(T.ResizeShortestEdge)(short_edge_length=(128,), max_size=128, sample_style="choice"),
            L(T.RandomFlip)(horizontal=True),
        ],
        image_format="BGR",
        use_instance_mask=False,
    ),
    num_workers=1,
    aspect_ratio_grouping=False,
)
dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_detection_dataset_dicts)(names="shapes_val", filter_empty=False),
    mapper=L(DatasetMapper)(
        is_train=False,
        augmentations=[L(T.ResizeShortestEdge)(short_edge_length=128, max_size=128)],
        image_format="${...train.mapper.image_format}",
    ),
)
