"""The harder built-in video task, ``direction_speed``: 4 directions x slow / fast with
camera shake. Single frames carry nothing about the class; the generation is seeded;
the dataset's lists, classes and config keys follow the task."""

import os

import numpy as np
import pytest

from largedet_video.data import MovingShapesSpec, prepare_moving_shapes
from largedet_video.data.moving_shapes import TASKS, load_moving_shapes, render_moving_shape

SPEC = MovingShapesSpec(num_frames=8, width=40, height=40, task="direction_speed",
                        speed=(1.5, 2.0), slow_speed=(0.75, 1.25), radius=(3.0, 6.0),
                        jitter=1.0, noise=12.0)  # fmt: skip


def test_eight_classes_direction_times_speed():
    assert SPEC.classes == TASKS["direction_speed"]
    assert SPEC.classes == ("right_slow", "right_fast", "left_slow", "left_fast",
                            "down_slow", "down_fast", "up_slow", "up_fast")  # fmt: skip
    assert MovingShapesSpec().classes == ("right", "left", "down", "up")


def test_the_first_frame_is_the_same_for_every_class_and_the_motion_is_not():
    """With the same random draws every class renders the same first frame (same shapes,
    background, shake and noise): a frame alone cannot tell the classes apart, and since
    the start is uniform on the torus, neither can any later frame on its own."""
    videos = {c: render_moving_shape(np.random.default_rng(7), c, SPEC) for c in SPEC.classes}
    first = videos["right_slow"][0]
    for c, v in videos.items():
        assert v.shape == (8, 40, 40, 3) and v.dtype == np.uint8
        assert np.array_equal(v[0], first), c
    last = [videos[c][-1].tobytes() for c in SPEC.classes]
    assert len(set(last)) == 8  # eight different motions


def _midpoints(spec, pace, seed):
    """Per frame t >= 1, the mean column where a noise-free, shake-free rendering differs
    from the same draws with a still shape: the mover's old and new place, so their
    midpoint, which moves at half the shape's speed."""
    clean = MovingShapesSpec(**{**spec.__dict__, "jitter": 0.0, "noise": 0.0})
    still = MovingShapesSpec(**{**clean.__dict__, "speed": (0.0, 0.0), "slow_speed": (0.0, 0.0)})
    moving = render_moving_shape(np.random.default_rng(seed), f"right_{pace}", clean).astype(int)
    static = render_moving_shape(np.random.default_rng(seed), f"right_{pace}", still).astype(int)
    xs = []
    for m, s in zip(moving[1:], static[1:]):
        cols = np.nonzero((np.abs(m - s).sum(axis=2) > 30).any(axis=0))[0]
        if cols.size == 0 or cols.min() < 4 or cols.max() > spec.width - 5:
            return None  # hidden, or across the frame's edge (the frame is a torus)
        xs.append(cols.mean())
    return np.array(xs)


def test_slow_classes_move_slower_than_fast_ones():
    spec = MovingShapesSpec(num_frames=8, width=160, height=40, task="direction_speed",
                            speed=(3.0, 3.0), slow_speed=(1.0, 1.0), radius=(4.0, 4.0))  # fmt: skip
    # the first seeds whose shape stays visible and off the frame's edges
    slow = next(x for x in (_midpoints(spec, "slow", k) for k in range(50)) if x is not None)
    fast = next(x for x in (_midpoints(spec, "fast", k) for k in range(50)) if x is not None)
    assert np.diff(slow).mean() == pytest.approx(0.5, abs=0.15)
    assert np.diff(fast).mean() == pytest.approx(1.5, abs=0.15)


def test_camera_shake_shifts_whole_frames_by_at_most_jitter():
    spec = MovingShapesSpec(num_frames=6, width=40, height=40, task="direction_speed", jitter=2.0, noise=0.0)
    still = MovingShapesSpec(**{**spec.__dict__, "jitter": 0.0})
    shaken = render_moving_shape(np.random.default_rng(5), "up_slow", spec)
    plain = render_moving_shape(np.random.default_rng(5), "up_slow", still)
    # frame 0: the shaken frame is the plain one rolled by its offset, within [-2, 2]
    hits = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
            if np.array_equal(np.roll(plain[0], (dy, dx), axis=(0, 1)), shaken[0])]  # fmt: skip
    assert hits, "frame 0 is not a shifted copy of the unshaken frame"


def test_generated_dataset_is_deterministic_and_lists_eight_labels(tmp_path):
    spec = MovingShapesSpec(num_train=16, num_val=8, num_frames=6, width=32, height=32, seed=2,
                            task="direction_speed", jitter=1.0)  # fmt: skip
    a = prepare_moving_shapes(spec, str(tmp_path / "a"))
    b = prepare_moving_shapes(spec, str(tmp_path / "b"))
    assert "direction_speed" in os.path.basename(a)
    train = load_moving_shapes(a, "train")
    assert [r["label"] for r in train] == [i % 8 for i in range(16)]
    with open(os.path.join(a, "classes.txt")) as f:
        assert tuple(f.read().split()) == spec.classes
    for name in ("train.txt", "val.txt", "classes.txt"):
        with open(os.path.join(a, name)) as fa, open(os.path.join(b, name)) as fb:
            assert fa.read() == fb.read(), name
    # the frames are the seed's alone (rendered again here, equal to the last value); x264 does
    # not give the same bytes for the same frames from run to run, so each generated video is
    # checked decoded: within the encoder's error of its own frames (mean 7 to 11 here; 57 to 78
    # from the next video's frames), and nearer them than the next video's
    import av

    def decoded(path):
        with av.open(path) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(int)

    for split_id, split in enumerate(("train", "val")):
        names = sorted(os.listdir(os.path.join(a, "videos", split)))
        assert names == sorted(os.listdir(os.path.join(b, "videos", split))) and len(names) == spec.num_videos(split)
        frames = [render_moving_shape(np.random.default_rng([spec.seed, split_id, i]), spec.classes[i % 8], spec)
                  for i in range(len(names))]  # fmt: skip
        again = render_moving_shape(np.random.default_rng([spec.seed, split_id, 0]), spec.classes[0], spec)
        assert np.array_equal(frames[0], again)
        for root in (a, b):
            for i, name in enumerate(names):
                video = decoded(os.path.join(root, "videos", split, name))
                own = np.abs(video - frames[i]).mean()
                other = np.abs(video - frames[(i + 1) % len(names)]).mean()
                assert own < 16.0 and own < other, (root, name, own, other)


def test_config_keys_make_the_spec_and_register_eight_classes():
    from detectron2.config import get_cfg
    from detectron2.data import MetadataCatalog

    from largedet_video import add_video_config
    from largedet_video.data.builtin import moving_shapes_spec, register_video_datasets

    cfg = get_cfg()
    add_video_config(cfg)
    cfg.merge_from_file(os.path.join(os.path.dirname(__file__), "..", "configs", "study",
                                     "Base-Study-TSM-R18w16-8f-32px.yaml"))  # fmt: skip
    spec = moving_shapes_spec(cfg)
    assert (spec.task, spec.jitter, spec.noise, spec.num_frames) == ("direction_speed", 1.5, 12.0, 16)
    assert spec.slow_speed == (0.8, 1.2) and spec.speed == (1.3, 1.7)
    register_video_datasets(cfg)
    meta = MetadataCatalog.get("moving_shapes_val")
    assert meta.num_classes == 8 == cfg.MODEL.VIDEO.NUM_CLASSES
    # the default task keeps its folder name (existing caches stay valid)
    assert MovingShapesSpec().folder_name == "moving_shapes_96x72_32f_800-200_25fps_v3-4_r5-9_seed0"


def test_an_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        MovingShapesSpec(task="rotation")
