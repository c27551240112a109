"""Video data: lists, decoding, frame sampling, crops, datasets and loaders."""

from .build import (
    MultigridTrainLoader,
    VideoTrainLoader,
    build_multigrid_train_loader,
    build_video_dataset,
    build_video_test_loader,
    build_video_train_loader,
)
from .builtin import register_video_datasets, register_video_list
from .dataset import TestViews, TrainAugmentation, VideoDataset
from .decoding import VideoDecodeError, open_video
from .lists import load_kinetics_csv, load_video_list
from .moving_shapes import MOVING_SHAPES_CLASSES, MovingShapesSpec, prepare_moving_shapes
from .sampling import ClipShape, FrameSampling

__all__ = [
    "build_video_dataset",
    "build_video_train_loader",
    "build_video_test_loader",
    "build_multigrid_train_loader",
    "VideoTrainLoader",
    "MultigridTrainLoader",
    "register_video_datasets",
    "register_video_list",
    "VideoDataset",
    "TrainAugmentation",
    "TestViews",
    "VideoDecodeError",
    "open_video",
    "load_video_list",
    "load_kinetics_csv",
    "MOVING_SHAPES_CLASSES",
    "MovingShapesSpec",
    "prepare_moving_shapes",
    "ClipShape",
    "FrameSampling",
]
