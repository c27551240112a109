"""A user's module for largedet's tools (docs/extend.md): an optimizer, a dataset, an
evaluator, a backbone and a hook, each registered where largedet and Detectron2 look
names up. Nothing here edits largedet; the tools import it with ``--import my_ext``, in
every process of the run::

    PYTHONPATH=docs/examples python tools/train_net.py --import my_ext \\
        --config configs/shapes/faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml \\
        SOLVER.OPTIMIZER MyRAdam DATASETS.TRAIN "('my_shapes_train',)" --num-gpus 2
"""

import logging

import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json
from detectron2.engine import HookBase
from detectron2.evaluation import DatasetEvaluator
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.utils import comm

from largedet.data import ShapesSpec, generate_shapes
from largedet.engine import HOOK_REGISTRY
from largedet.evaluation import EVALUATOR_REGISTRY
from largedet.modeling.backbone import build_basic_resnet_fpn_backbone
from largedet.solver import OPTIMIZER_REGISTRY, get_optimizer_params

# under the "largedet" logger, which the tools write to the console and OUTPUT_DIR/log.txt
logger = logging.getLogger(f"largedet.{__name__}")


# --- an optimizer: SOLVER.OPTIMIZER MyRAdam ------------------------------------------------
@OPTIMIZER_REGISTRY.register()
def MyRAdam(cfg, model):  # noqa: N802  (the name is the SOLVER.OPTIMIZER value)
    """torch's RAdam on largedet's parameter groups (no weight decay on norms and biases),
    at the run's peak LR (``cfg.SOLVER.BASE_LR``, the LSR's where it is on)."""
    return torch.optim.RAdam(
        get_optimizer_params(cfg, model), lr=cfg.SOLVER.BASE_LR, weight_decay=cfg.SOLVER.WEIGHT_DECAY
    )


# --- a dataset: DATASETS.TRAIN "('my_shapes_train',)", DATASETS.TEST "('my_shapes_val',)" ---
# The files: a small generated set of COCO-format images, standing in for one's own.
MY_SHAPES = ShapesSpec(num_train=96, num_val=16, image_size=64, seed=7)


def _load(split):
    """The split's images as Detectron2's dicts (generated on first use)."""
    generate_shapes(MY_SHAPES)
    return load_coco_json(MY_SHAPES.json_file(split), MY_SHAPES.image_root(split), f"my_shapes_{split}")


for _split in ("train", "val"):
    DatasetCatalog.register(f"my_shapes_{_split}", lambda split=_split: _load(split))
    MetadataCatalog.get(f"my_shapes_{_split}").set(
        thing_classes=["circle", "square", "triangle"], evaluator_type="shape_count"
    )


# --- an evaluator, for the datasets whose evaluator_type is "shape_count" ------------------
class ShapeCountEvaluator(DatasetEvaluator):
    """How often the detector finds as many shapes as an image holds: detections scoring
    at least ``threshold`` against the annotations, per image; results in percent (exact
    count) and shapes (mean absolute error), over every process's images."""

    def __init__(self, dataset_name, threshold=0.5):
        self._truth = {d["image_id"]: len(d["annotations"]) for d in DatasetCatalog.get(dataset_name)}
        self._threshold = threshold
        self._errors = []

    def reset(self):
        self._errors = []

    def process(self, inputs, outputs):
        for image, output in zip(inputs, outputs):
            found = int((output["instances"].scores >= self._threshold).sum())
            self._errors.append(abs(found - self._truth[image["image_id"]]))

    def evaluate(self):
        errors = sum(comm.gather(self._errors), [])
        if not comm.is_main_process():
            return {}
        exact = 100.0 * sum(e == 0 for e in errors) / max(len(errors), 1)
        return {"shape_count": {"exact": exact, "mae": sum(errors) / max(len(errors), 1)}}


@EVALUATOR_REGISTRY.register()
def shape_count(cfg, dataset_name, output_folder):  # the evaluator_type it serves
    return ShapeCountEvaluator(dataset_name)


# --- a backbone: MODEL.BACKBONE.NAME build_my_backbone ---------------------------------------
@BACKBONE_REGISTRY.register()
def build_my_backbone(cfg, input_shape):
    """One's own network goes here; this one is largedet's basic-block ResNet under an FPN."""
    return build_basic_resnet_fpn_backbone(cfg, input_shape)


# --- a hook: HOOKS "('LowestLoss',)" ----------------------------------------------------------
@HOOK_REGISTRY.register()
class LowestLoss(HookBase):
    """Logs the lowest training loss of the run and its step at the end; kept in checkpoints
    (``state_dict``), so that a resumed run remembers it."""

    def __init__(self, cfg):
        self.lowest, self.step = float("inf"), -1

    def after_step(self):
        if self.trainer.loop.last_total_loss < self.lowest:
            self.lowest, self.step = self.trainer.loop.last_total_loss, self.trainer.iter

    def after_train(self):
        logger.info("LowestLoss: %.4f at step %d (rank %d)", self.lowest, self.step, comm.get_rank())

    def state_dict(self):
        return {"lowest": self.lowest, "step": self.step}

    def load_state_dict(self, state):
        self.lowest, self.step = state["lowest"], state["step"]
