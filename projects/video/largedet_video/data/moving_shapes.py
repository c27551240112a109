"""The built-in datasets: MP4 videos of a moving shape whose class is the
direction it moves (right, left, down, up), or, in the harder ``direction_speed``
task, its direction and its speed (slow or fast: 8 classes).

Only motion tells the classes apart. Each video shows one shape (circle, square
or triangle, random colour, size and rotation) moving at constant speed in its
class's direction, plus static distractor shapes on a random background, with
per-frame noise. The moving shape starts anywhere and wraps around the frame
edges (the frame is a torus), so in every single frame its position, look and
surroundings have the same distribution for all four classes: a model that
sees frames independently (TSN) cannot beat chance (25%); one that relates
neighbouring frames (TSM) can be near perfect.

The ``direction_speed`` task (:data:`TASKS`) keeps all of that and splits every
direction into a slow and a fast class whose speed ranges are close
(``slow_speed``, ``speed``), and shakes the camera: every frame is shifted by a
random offset of up to ``jitter`` pixels (the same shift for the whole frame,
wrapped around), so the displacement between two frames is the shape's motion
plus noise of the order of the slow-fast difference. Telling slow from fast needs
the shape's position relative to the static background over several frames;
single frames still carry nothing (TSN: chance, 12.5%). It is the task with
headroom for the batch-scaling study of ``study/video_batch_study.py``.

Videos are written once (``largedet.data.build_once``), under
``largedet.data.datasets_root()`` (``$LARGEDET_DATASETS``, default
``~/.cache/largedet/datasets``) in a folder named by the generator's
parameters, with Kinetics-style lists ``train.txt`` / ``val.txt`` of
``path label`` lines and ``classes.txt``. The same seed gives the same videos.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Dict, List

import av
import cv2
import numpy as np

from largedet.data import build_once, datasets_root

from .lists import load_video_list

__all__ = [
    "MOVING_SHAPES_CLASSES",
    "TASKS",
    "MovingShapesSpec",
    "default_datasets_root",
    "render_moving_shape",
    "write_mp4",
    "prepare_moving_shapes",
    "load_moving_shapes",
]

logger = logging.getLogger(__name__)

MOVING_SHAPES_CLASSES = ("right", "left", "down", "up")
#: the generated tasks and their classes: label i of a split is class i % len(classes)
TASKS = {
    "direction": MOVING_SHAPES_CLASSES,
    "direction_speed": tuple(f"{d}_{s}" for d in MOVING_SHAPES_CLASSES for s in ("slow", "fast")),
}
_DIRECTIONS = {"right": (1.0, 0.0), "left": (-1.0, 0.0), "down": (0.0, 1.0), "up": (0.0, -1.0)}
_SPLITS = ("train", "val")


def default_datasets_root() -> str:
    """``largedet.data.datasets_root()``: ``$LARGEDET_DATASETS``, or
    ``~/.cache/largedet/datasets`` when it is unset or empty."""
    return datasets_root()


@dataclass(frozen=True)
class MovingShapesSpec:
    """Parameters of the generated dataset (all of them name its cache folder).

    Attributes:
        num_train, num_val: videos per split (classes balanced: label = i % 4).
        num_frames: frames per video.
        width, height: frame size in pixels (even, for yuv420p).
        seed: the generator's seed.
        fps: frame rate written in the container.
        speed: (min, max) speed of the moving shape, pixels per frame.
        radius: (min, max) radius of every shape, pixels.
        task: ``"direction"`` (4 classes) or ``"direction_speed"`` (8: each direction
            slow, at ``slow_speed``, or fast, at ``speed``), see :data:`TASKS`.
        slow_speed: (min, max) speed of the slow classes, pixels per frame.
        jitter: camera shake, the largest shift of a frame in pixels (0: none).
        noise: standard deviation of the per-pixel noise.
    """

    num_train: int = 800
    num_val: int = 200
    num_frames: int = 32
    width: int = 96
    height: int = 72
    seed: int = 0
    fps: int = 25
    speed: tuple = (3.0, 4.0)
    radius: tuple = (5.0, 9.0)
    task: str = "direction"
    slow_speed: tuple = (1.0, 1.5)
    jitter: float = 0.0
    noise: float = 6.0

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"moving shapes: task must be one of {sorted(TASKS)}, got {self.task!r}")
        for key in ("num_train", "num_val", "num_frames"):
            if getattr(self, key) < 1:
                raise ValueError(f"moving shapes: {key} must be >= 1, got {getattr(self, key)}")

    @property
    def classes(self) -> tuple:
        return TASKS[self.task]

    @property
    def folder_name(self) -> str:
        name = (
            f"moving_shapes_{self.width}x{self.height}_{self.num_frames}f_"
            f"{self.num_train}-{self.num_val}_{self.fps}fps_"
            f"v{self.speed[0]:g}-{self.speed[1]:g}_r{self.radius[0]:g}-{self.radius[1]:g}_"
            f"seed{self.seed}"
        )
        if self.task != "direction" or self.jitter or self.noise != 6.0:
            name += (
                f"_{self.task}_slow{self.slow_speed[0]:g}-{self.slow_speed[1]:g}"
                f"_j{self.jitter:g}_n{self.noise:g}"
            )
        return name

    def num_videos(self, split: str) -> int:
        return self.num_train if split == "train" else self.num_val


def _shape_points(kind: str, cx: float, cy: float, r: float, angle: float) -> np.ndarray:
    corners = 4 if kind == "square" else 3
    a = angle + 2 * np.pi * np.arange(corners) / corners
    return np.stack([cx + r * np.cos(a), cy + r * np.sin(a)], axis=1)


def _draw_shape(
    img: np.ndarray, kind: str, cx: float, cy: float, r: float, angle: float, color
) -> None:
    if kind == "circle":
        cv2.circle(img, (int(round(cx)), int(round(cy))), int(round(r)), color, -1, cv2.LINE_AA)
    else:
        pts = np.round(_shape_points(kind, cx, cy, r, angle)).astype(np.int32)
        cv2.fillPoly(img, [pts], color, cv2.LINE_AA)


def _random_shape(rng: np.random.Generator, spec: MovingShapesSpec, lo: int, hi: int) -> Dict:
    return {
        "kind": ("circle", "square", "triangle")[int(rng.integers(3))],
        "cx": float(rng.uniform(0, spec.width)),
        "cy": float(rng.uniform(0, spec.height)),
        "r": float(rng.uniform(*spec.radius)),
        "angle": float(rng.uniform(0, 2 * np.pi)),
        "color": tuple(int(c) for c in rng.integers(lo, hi, size=3)),
    }


def render_moving_shape(
    rng: np.random.Generator, direction: str, spec: MovingShapesSpec
) -> np.ndarray:
    """Frames ``(num_frames, height, width, 3)`` uint8 RGB of one video whose shape
    moves in ``direction`` (one of MOVING_SHAPES_CLASSES, or a class of
    ``spec.task`` such as ``"left_slow"``)."""
    direction, _, pace = direction.partition("_")
    w, h = spec.width, spec.height
    background = np.empty((h, w, 3), np.uint8)
    background[:] = rng.integers(20, 110, size=3)
    for _ in range(int(rng.integers(2, 5))):
        s = _random_shape(rng, spec, 60, 256)
        _draw_shape(background, s["kind"], s["cx"], s["cy"], s["r"], s["angle"], s["color"])

    mover = _random_shape(rng, spec, 120, 256)
    speed = rng.uniform(*(spec.slow_speed if pace == "slow" else spec.speed))
    dx, dy = (speed * d for d in _DIRECTIONS[direction])
    shake = None
    if spec.jitter:
        shake = np.round(rng.uniform(-spec.jitter, spec.jitter, size=(spec.num_frames, 2)))
        shake = shake.astype(np.int64)
    frames = np.empty((spec.num_frames, h, w, 3), np.uint8)
    for t in range(spec.num_frames):
        img = background.copy()
        cx, cy = (mover["cx"] + dx * t) % w, (mover["cy"] + dy * t) % h
        # Draw the copies across the edges too, so the shape wraps around.
        for ox in (-w, 0, w):
            for oy in (-h, 0, h):
                _draw_shape(
                    img, mover["kind"], cx + ox, cy + oy, mover["r"], mover["angle"], mover["color"]
                )
        if shake is not None:
            img = np.roll(img, (int(shake[t, 1]), int(shake[t, 0])), axis=(0, 1))
        noise = rng.normal(0.0, spec.noise, size=img.shape)
        frames[t] = np.clip(img + noise, 0, 255).astype(np.uint8)
    return frames


def write_mp4(path: str, frames: np.ndarray, fps: int = 25, codec: str = "libx264") -> None:
    """Encode ``frames`` (T, H, W, 3) uint8 RGB as an MP4 file with PyAV."""
    with av.open(path, mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            # one encoding thread; x264 still gives slightly different bytes for the same frames
            # from run to run (the decoded pixels agree to within its error), so nothing compares them
            stream.options = {"crf": "20", "preset": "veryfast", "threads": "1"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _codec() -> str:
    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def _generate(folder: str, spec: MovingShapesSpec) -> None:
    codec = _codec()
    for split_id, split in enumerate(_SPLITS):
        os.makedirs(os.path.join(folder, "videos", split))
        lines = []
        for i in range(spec.num_videos(split)):
            label = i % len(spec.classes)
            rng = np.random.default_rng([spec.seed, split_id, i])
            frames = render_moving_shape(rng, spec.classes[label], spec)
            rel = os.path.join("videos", split, f"{i:06d}.mp4")
            write_mp4(os.path.join(folder, rel), frames, spec.fps, codec)
            lines.append(f"{rel} {label}\n")
        with open(os.path.join(folder, f"{split}.txt"), "w") as f:
            f.writelines(lines)
    with open(os.path.join(folder, "classes.txt"), "w") as f:
        f.writelines(f"{name}\n" for name in spec.classes)


def prepare_moving_shapes(spec: MovingShapesSpec, root: str = "") -> str:
    """The dataset's folder under ``root`` (default :func:`default_datasets_root`),
    generating it first if it is not there yet.

    Generation (``largedet.data.build_once``) writes to a temporary folder that is
    renamed into place when complete, under a lock, so an interrupted run leaves no
    half dataset, and of processes asking at the same time (DDP ranks) one generates
    while the others wait for it.
    """
    folder = os.path.join(root or default_datasets_root(), spec.folder_name)

    def build(out_dir: str) -> None:
        start = time.perf_counter()
        logger.info(
            "Generating the moving-shapes dataset (%d train + %d val videos) in %s",
            spec.num_train,
            spec.num_val,
            folder,
        )
        _generate(out_dir, spec)
        logger.info("Moving-shapes dataset ready in %.1f s", time.perf_counter() - start)

    return build_once(
        folder, build, is_complete=lambda f: os.path.isfile(os.path.join(f, "classes.txt"))
    )


def load_moving_shapes(folder: str, split: str) -> List[Dict]:
    """Records of one split (``"train"`` or ``"val"``) of a prepared dataset."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    return load_video_list(os.path.join(folder, f"{split}.txt"), root=folder)
