"""Inference on single images with a config's model: :class:`Predictor`, with the contract of
Detectron2's ``DefaultPredictor`` (a BGR image in, the model's output dict out) and
largedet's model builder and checkpointer."""

from __future__ import annotations

import logging
from typing import Optional, Type

import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import transforms as T

from ..checkpoint import AtomicCheckpointer
from .trainer import Trainer

__all__ = ["Predictor"]

logger = logging.getLogger(__name__)


class Predictor:
    """``predictor(image)``: the predictions of ``cfg``'s model on one image, as Detectron2's
    ``DefaultPredictor`` gives them (``{"instances": Instances}`` in the image's pixels).

    Differences from ``DefaultPredictor``: the model is built by ``trainer_cls.build_model``
    (default largedet's :class:`~largedet.engine.Trainer`: a "SyncBN" norm runs on
    ``MODEL.DEVICE``), and weights are read by largedet's checkpointer (a ``.pkl`` runs no
    code). With ``resume``, the weights are the last checkpoint of ``OUTPUT_DIR`` where it
    has one (as ``--eval-only --resume`` takes them), nothing in the folder being changed;
    without weights the model keeps its random initialisation, with a warning.
    :attr:`weights` names the file loaded ("" for none).

    Args:
        cfg: a resolved config (``MODEL.DEVICE`` a torch device: :func:`largedet.engine.defaults.setup_cfg`).
        trainer_cls: the trainer whose ``build_model`` builds the model.
        resume: prefer ``OUTPUT_DIR``'s last checkpoint to ``MODEL.WEIGHTS``.
    """

    def __init__(self, cfg: CfgNode, trainer_cls: Optional[Type] = None, resume: bool = False):
        self.cfg = cfg.clone()
        self.model = (trainer_cls or Trainer).build_model(self.cfg)
        self.model.eval()
        checkpointer = AtomicCheckpointer(self.model, save_dir=cfg.OUTPUT_DIR)
        self.weights = cfg.MODEL.WEIGHTS
        if resume and checkpointer.has_checkpoint():
            self.weights = checkpointer.get_checkpoint_file()
        if self.weights:
            checkpointer.load(self.weights, checkpointables=[])
        else:
            logger.warning("No weights (MODEL.WEIGHTS is empty): predicting with random weights")
        self.aug = T.ResizeShortestEdge(
            [cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST], cfg.INPUT.MAX_SIZE_TEST
        )
        if cfg.INPUT.FORMAT not in ("RGB", "BGR"):
            raise ValueError(
                f"INPUT.FORMAT: the predictor reads RGB or BGR images, not {cfg.INPUT.FORMAT!r}"
            )
        self.input_format = cfg.INPUT.FORMAT

    def __call__(self, original_image: np.ndarray) -> dict:
        """``original_image``: (H, W, 3) uint8, BGR (OpenCV's order, as ``DefaultPredictor``).
        Returns the model's output for it (``"instances"`` in the image's own size)."""
        with torch.no_grad():
            if self.input_format == "RGB":
                original_image = original_image[:, :, ::-1]
            height, width = original_image.shape[:2]
            image = self.aug.get_transform(original_image).apply_image(original_image)
            image = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
            return self.model([{"image": image, "height": height, "width": width}])[0]
