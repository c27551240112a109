"""The installed stack works: torchvision's compiled ops, Detectron2 models on the CPU."""

import torch
import torchvision

import largedet  # noqa: F401


def test_torchvision_nms_keeps_the_expected_boxes():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7])
    # IoU(box0, box1) = 81 / (100 + 100 - 81) = 0.68 > 0.5: box1 is suppressed.
    assert torchvision.ops.nms(boxes, scores, 0.5).tolist() == [0, 2]
    # ... but kept when the threshold is above 0.68.
    assert torchvision.ops.nms(boxes, scores, 0.7).tolist() == [0, 1, 2]


def test_torchvision_roi_align_averages_a_constant_region():
    # a 1x1x4x4 feature map whose value at (y, x) is 4y + x; a RoI covering the
    # whole map pooled to 1x1 with 2x2 samples at pixel-centre-aligned positions.
    feature = torch.arange(16, dtype=torch.float32).reshape(1, 1, 4, 4)
    rois = torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]])
    out = torchvision.ops.roi_align(feature, rois, output_size=1, spatial_scale=1.0, sampling_ratio=2, aligned=True)
    # samples at (x, y) in {1, 3} - 0.5 = {0.5, 2.5}: bilinear values 4y + x averaged = 4*1.5 + 1.5
    assert out.item() == torch.tensor(7.5).item()


def test_detectron2_model_zoo_mask_rcnn_trains_on_cpu():
    from detectron2 import model_zoo
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    from detectron2.structures import BitMasks, Boxes, Instances
    from detectron2.utils.events import EventStorage

    cfg = get_cfg()
    cfg.merge_from_file(model_zoo.get_config_file("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    model = build_model(cfg)
    model.train()
    masks = torch.zeros(1, 96, 128, dtype=torch.bool)
    masks[0, 20:60, 30:90] = True
    inst = Instances((96, 128), gt_boxes=Boxes(torch.tensor([[30.0, 20.0, 90.0, 60.0]])),
                     gt_classes=torch.tensor([5]), gt_masks=BitMasks(masks))
    batch = [{"image": torch.randint(0, 255, (3, 96, 128), dtype=torch.uint8).float(), "instances": inst}]
    with EventStorage(0):
        losses = model(batch)
    assert set(losses) == {"loss_cls", "loss_box_reg", "loss_mask", "loss_rpn_cls", "loss_rpn_loc"}
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    # every trainable tensor (the frozen stem and res2 excluded) gets a finite gradient
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable)
    assert sum(p.numel() for p in trainable) > 40_000_000
    # the mask head received a gradient: Mask R-CNN's own branch ran
    assert model.roi_heads.mask_head.predictor.weight.grad.abs().sum() > 0
