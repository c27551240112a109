"""A tiny TSM learns the motion direction of moving shapes; the same network
without the shift (TSN) cannot, since no single frame tells the classes apart."""

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.utils.events import EventStorage

from largedet_video import add_video_config
from largedet_video.data import MOVING_SHAPES_CLASSES, MovingShapesSpec
from largedet_video.data.moving_shapes import render_moving_shape

SPEC = MovingShapesSpec(num_frames=4, width=16, height=16, radius=(2.0, 3.0), speed=(2.0, 3.0))


def clips(n, split):
    frames = np.stack(
        [
            render_moving_shape(
                np.random.default_rng([11, split, i]), MOVING_SHAPES_CLASSES[i % 4], SPEC
            )
            for i in range(n)
        ]
    )
    return torch.from_numpy(frames).permute(0, 1, 4, 2, 3).contiguous(), torch.arange(n) % 4


def train_and_test(backbone, train, test, iters=150, batch=32):
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.VIDEO.BACKBONE = backbone
    cfg.MODEL.VIDEO.NUM_CLASSES = 4
    cfg.MODEL.VIDEO.DROPOUT = 0.0
    cfg.MODEL.VIDEO.RESNET.DEPTH = 10
    cfg.MODEL.VIDEO.RESNET.WIDTH = 16
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(0)
    (x, y), (x_test, y_test) = train, test
    with EventStorage():
        for _ in range(iters):
            idx = torch.randint(0, len(x), (batch,), generator=gen)
            loss = model({"clip": x[idx], "label": y[idx]})["loss_cls"]
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        scores = model({"clip": x_test})["scores"]
    return 100.0 * (scores.argmax(dim=1) == y_test).float().mean().item()


@pytest.mark.usefixtures("single_thread")
def test_tiny_tsm_beats_tiny_tsn():
    train, test = clips(1024, 0), clips(200, 1)
    tsm = train_and_test("TSMResNet", train, test)
    tsn = train_and_test("TSNResNet", train, test)
    assert tsm >= 60.0, (tsm, tsn)
    assert tsn <= 40.0, (tsm, tsn)
