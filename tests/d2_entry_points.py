"""Exercise Detectron2's public entry points and print what they did, as JSON.

Run by ``tests/test_d2_untouched.py`` in fresh interpreters, once as plain Detectron2
and once with ``--with-largedet`` (``import largedet`` before anything of
Detectron2); the two ``WORK_DIR/observed.json`` files it writes must be equal
(stdout is left to pycocotools' printing). Failures are recorded (exception type
and message), not raised: a Detectron2 lacking ``detectron2._C`` fails some of
these calls, and it must fail them the same way after ``import largedet``.

    python tests/d2_entry_points.py WORK_DIR [--with-largedet]
"""

import argparse
import json
import os
import sys


def _outcome(fn):
    try:
        return {"ok": fn()}
    except Exception as e:  # recorded for the comparison, never swallowed silently
        return {"error": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}


def _tiny_coco(work_dir: str) -> str:
    """Two 64x64 images with two boxes of category 1, as a COCO instances file."""
    gt = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 64} for i in (1, 2)],
        "categories": [{"id": 1, "name": "thing"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "area": 400, "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 1, "bbox": [30, 30, 24, 16], "area": 384, "iscrowd": 0},
        ],
    }
    path = os.path.join(work_dir, "tiny_coco.json")
    with open(path, "w") as f:
        json.dump(gt, f)
    return path


def coco_evaluator_with_defaults(work_dir: str):
    """Detectron2's ``COCOEvaluator(name)``: every argument but the dataset left at its default."""
    import torch
    from detectron2.data.datasets import register_coco_instances
    from detectron2.evaluation import COCOEvaluator
    from detectron2.structures import Boxes, Instances

    register_coco_instances("d2_entry_points_tiny", {}, _tiny_coco(work_dir), work_dir)
    evaluator = COCOEvaluator("d2_entry_points_tiny")
    evaluator.reset()
    # image 1: a hit (IoU 1) and a miss; image 2: a box shifted by 4 pixels (IoU 320 / 448 = 0.71)
    predictions = {
        1: [[8.0, 8.0, 28.0, 28.0], [40.0, 0.0, 60.0, 10.0]],
        2: [[34.0, 30.0, 58.0, 46.0]],
    }
    for image_id, boxes in predictions.items():
        inst = Instances((64, 64))
        inst.pred_boxes = Boxes(torch.tensor(boxes))
        inst.scores = torch.linspace(0.9, 0.5, len(boxes))
        inst.pred_classes = torch.ones(len(boxes), dtype=torch.int64)
        evaluator.process([{"image_id": image_id}], [{"instances": inst}])
    results = evaluator.evaluate()
    # NaN (no object of that size) as a string: NaN is unequal to itself
    return {
        task: {k: round(float(v), 6) if v == v else "nan" for k, v in metrics.items()}
        for task, metrics in results.items()
    }


def faster_rcnn_forward():
    """``build_model`` on a small Faster R-CNN config (R-18 FPN), a training and an inference forward."""
    import torch
    from detectron2 import model_zoo
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    from detectron2.structures import Boxes, Instances
    from detectron2.utils.events import EventStorage

    cfg = get_cfg()
    cfg.merge_from_file(model_zoo.get_config_file("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.RPN.POST_NMS_TOPK_TRAIN = 64
    cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 64
    cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.0
    torch.manual_seed(0)
    model = build_model(cfg)
    image = torch.randint(0, 255, (3, 64, 96), generator=torch.Generator().manual_seed(1)).float()
    gt = Instances((64, 96), gt_boxes=Boxes(torch.tensor([[10.0, 12.0, 50.0, 40.0]])), gt_classes=torch.tensor([1]))
    model.train()
    with EventStorage(0):
        losses = model([{"image": image, "instances": gt}])
    model.eval()
    with torch.no_grad():
        (out,) = model([{"image": image, "height": 64, "width": 96}])
    inst = out["instances"]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "losses": {k: float(v) for k, v in sorted(losses.items())},
        "detections": len(inst),
        "score_sum": float(inst.scores.sum()),
        "box_sum": float(inst.pred_boxes.tensor.sum()),
    }


def layers():
    """``detectron2.layers``: NMS and RoIAlign (torchvision underneath), and the ops that need
    ``detectron2._C`` (deformable convolution, rotated NMS): what each does."""
    import torch
    from detectron2.layers import ROIAlign, batched_nms, nms

    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7])
    feature = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4)
    rois = torch.tensor([[0, 0.5, 0.5, 3.5, 2.5]])

    def deform_conv():
        from detectron2.layers import DeformConv

        conv = DeformConv(2, 2, kernel_size=3, padding=1)
        return list(conv(torch.ones(1, 2, 4, 4), torch.zeros(1, 18, 4, 4)).shape)

    def nms_rotated():
        from detectron2.layers import nms_rotated

        rotated = torch.tensor([[5.0, 5.0, 4.0, 4.0, 0.0], [5.0, 5.0, 4.0, 4.0, 10.0]])
        return nms_rotated(rotated, torch.tensor([0.9, 0.8]), 0.5).tolist()

    return {
        "nms": nms(boxes, scores, 0.5).tolist(),
        "batched_nms": batched_nms(boxes, scores, torch.tensor([0, 1, 0]), 0.5).tolist(),
        "roi_align": ROIAlign((2, 2), 1.0, 2, aligned=True)(feature, rois).flatten().tolist(),
        "deform_conv": _outcome(deform_conv),
        "nms_rotated": _outcome(nms_rotated),
    }


def compiled_extension():
    """How Detectron2's own code sees ``detectron2._C``: its environment report and the
    module state after everything above."""
    import detectron2
    from detectron2.utils.collect_env import collect_env_info

    info = collect_env_info()
    rows = [line for line in info.splitlines() if "detectron2._C" in line or line.startswith("Compiler")]

    def fast_eval_api():
        from detectron2.evaluation import fast_eval_api

        return fast_eval_api.COCOeval_opt.__name__

    return {
        "collect_env_rows": rows,
        "fast_eval_api": _outcome(fast_eval_api),
        "in_sys_modules": "detectron2._C" in sys.modules,
        "package_attribute": hasattr(detectron2, "_C"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir")
    parser.add_argument("--with-largedet", action="store_true")
    args = parser.parse_args()
    if args.with_largedet:
        import largedet  # noqa: F401
    observed = {
        "coco_evaluator": _outcome(lambda: coco_evaluator_with_defaults(args.work_dir)),
        "faster_rcnn": _outcome(faster_rcnn_forward),
        "layers": _outcome(layers),
        "compiled_extension": _outcome(compiled_extension),
    }
    with open(os.path.join(args.work_dir, "observed.json"), "w") as f:
        json.dump(observed, f, sort_keys=True, indent=1)


if __name__ == "__main__":
    main()
