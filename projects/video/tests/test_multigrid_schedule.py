"""The multigrid schedule against hand-computed small cases, one per rule.

All cases use the base shape B=2, T=8, S=16, where (rules 1 and 2):

- short-cycle crops: round(16 * 1/2) = 8, round(16 * 0.7071) = round(11.31) = 11;
- long-cycle shapes: (round(8/4), round(11.31)) = (2, 11), (4, 11), (4, 16), (8, 16);
- batch factor round(T*S^2 / (t*s^2)) = round(2048 / (t*s^2)):
  (2, 8): 2048/128 = 16      (2, 11): 2048/242 = 8.46 -> 8
  (4, 8): 2048/256 = 8       (4, 11): 2048/484 = 4.23 -> 4     (4, 16): 2
  (8, 8): 2048/512 = 4       (8, 11): 2048/968 = 2.12 -> 2     (8, 16): 1
"""

import math

import pytest

from largedet_video.multigrid import ClipShape, LRStep, build_multigrid_schedule


def shapes_of(stage):
    return [(s.batch_size, s.num_frames, s.crop_size) for s in stage.short_cycle_shapes]


def ends(schedule):
    return [s.end_epoch for s in schedule.stages]


def test_shapes_and_batch_factors_with_both_cycles():
    # Rules 1-2. Each long-cycle stage's short cycle: (t, 8), (t, 11), (t, s);
    # per-device batch = factor * B = factor * 2.
    sched = build_multigrid_schedule(2, 8, 16, [0, 23], 28)
    assert [shapes_of(s) for s in sched.stages] == [
        [(32, 2, 8), (16, 2, 11), (16, 2, 11)],  # factors 16, 8, 8
        [(16, 4, 8), (8, 4, 11), (8, 4, 11)],  # 8, 4, 4
        [(16, 4, 8), (8, 4, 11), (4, 4, 16)],  # 8, 4, 2
        [(8, 8, 8), (4, 8, 11), (2, 8, 16)],  # 4, 2, 1
        [(8, 8, 8), (4, 8, 11), (2, 8, 16)],  # fine-tuning: base shape, same cycle
    ]
    # Average factors: 32/3, 16/3, 14/3, 7/3, 7/3.
    assert [s.avg_batch_factor for s in sched.stages] == pytest.approx(
        [32 / 3, 16 / 3, 14 / 3, 7 / 3, 7 / 3]
    )
    # The stage's own shape is its long-cycle shape, the last of the cycle.
    assert [(s.batch_factor, s.num_frames, s.crop_size) for s in sched.stages] == [
        (8, 2, 11), (4, 4, 11), (2, 4, 16), (1, 8, 16), (1, 8, 16)
    ]
    assert sched.stages[0].long_cycle_shape == ClipShape(2, 11, 8, 16)
    assert sched.stages[-1].fine_tuning and not any(s.fine_tuning for s in sched.stages[:-1])
    assert sched.base_shape == ClipShape(8, 16, 1, 2)


def test_long_cycle_only_epochs():
    # Short cycle off: average factors are the shapes' factors 8, 4, 2, 1 (sum 15).
    # Rule 3: LR stage [0, 15) shared 8:4:2:1 -> 8, 4, 2, 1 epochs (1 "base
    # iteration-epoch" each). Rule 4: saving = 15 / (8/8 + 4/4 + 2/2 + 1/1) = 3.75;
    # fine-tuning = (20 - 15) / 3.75 * 1 = 4/3 epochs. Rule 5: total 15 + 4/3 = 49/3,
    # scaled to 20 * 1.5 = 30 by x = 90/49; cumulative 8, 12, 14, 15, 49/3 times x
    # = 14.69, 22.04, 25.71, 27.55, 30 -> ends 15, 22, 26, 28, 30.
    sched = build_multigrid_schedule(2, 8, 16, [0, 15], 20, short_cycle=False)
    assert [shapes_of(s) for s in sched.stages] == [
        [(16, 2, 11)], [(8, 4, 11)], [(4, 4, 16)], [(2, 8, 16)], [(2, 8, 16)]
    ]
    assert sched.iteration_saving == pytest.approx(3.75)
    x = 90 / 49
    assert [s.epochs for s in sched.stages] == pytest.approx([8 * x, 4 * x, 2 * x, x, 4 / 3 * x])
    assert ends(sched) == [15, 22, 26, 28, 30]
    assert [s.start_epoch for s in sched.stages] == [0, 15, 22, 26, 28]
    assert sched.max_epoch == 30
    # Rule 6: gamma^0 times each stage's factor; the fine-tuning stage [28, 30)
    # holds the previous LR until (28 + 30) // 2 = 29, then gamma^1.
    assert sched.lr_steps == [
        LRStep(0, 8.0), LRStep(15, 4.0), LRStep(22, 2.0), LRStep(26, 1.0),
        LRStep(28, 1.0), LRStep(29, pytest.approx(0.1)),
    ]  # fmt: skip


def test_both_cycles_epochs_and_lr():
    # Average factors 32/3, 16/3, 14/3, 7/3 (sum 23). Rule 3: LR stage [0, 23)
    # gives each stage its own average factor in epochs. Rule 4: saving =
    # 23 / (4 * 1) = 5.75; fine-tuning = (28 - 23) / 5.75 * 7/3 = 140/69.
    # Rule 5: total 23 + 140/69 = 1727/69, scaled to 42 by x = 2898/1727;
    # cumulative 32/3, 16, 62/3, 23, 1727/69 times x = 17.90, 26.85, 34.68,
    # 38.60, 42 -> ends 18, 27, 35, 39, 42.
    sched = build_multigrid_schedule(2, 8, 16, [0, 23], 28)
    assert sched.iteration_saving == pytest.approx(5.75)
    assert sched.stages[-1].epochs == pytest.approx(140 / 69 * 2898 / 1727)
    assert ends(sched) == [18, 27, 35, 39, 42]
    # Rule 6: the LR follows the long-cycle shape's factor (8, 4, 2, 1), not the
    # short cycle's average; fine-tuning [39, 42) splits at (39 + 42) // 2 = 40.
    assert [s.relative_lr for s in sched.stages] == [8.0, 4.0, 2.0, 1.0, 1.0]
    assert sched.lr_steps == [
        LRStep(0, 8.0), LRStep(18, 4.0), LRStep(27, 2.0), LRStep(35, 1.0),
        LRStep(39, 1.0), LRStep(40, pytest.approx(0.1)),
    ]  # fmt: skip


def test_lr_decays_by_gamma_per_lr_stage():
    # Long cycle only, two LR stages [0, 15), [15, 30) of the base schedule,
    # max 40, gamma 0.5. Each LR stage splits 8, 4, 2, 1. Saving = 30 / 8 = 3.75;
    # fine-tuning = 10 / 3.75 = 8/3. Total 98/3 scaled to 60 by x = 90/49:
    # cumulative 8, 12, 14, 15, 23, 27, 29, 30, 98/3 times x = 14.69, 22.04,
    # 25.71, 27.55, 42.24, 49.59, 53.27, 55.10, 60.
    sched = build_multigrid_schedule(
        2, 8, 16, [0, 15, 30], 40, gamma=0.5, short_cycle=False
    )
    assert ends(sched) == [15, 22, 26, 28, 42, 50, 53, 55, 60]
    assert [s.lr_stage for s in sched.stages] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    # gamma^k * factor: 8, 4, 2, 1 then 0.5 * (8, 4, 2, 1); fine-tuning [55, 60)
    # at 0.5 until (55 + 60) // 2 = 57, then 0.5^2 = 0.25.
    assert sched.lr_steps == [
        LRStep(0, 8.0), LRStep(15, 4.0), LRStep(22, 2.0), LRStep(26, 1.0),
        LRStep(28, 4.0), LRStep(42, 2.0), LRStep(50, 1.0), LRStep(53, 0.5),
        LRStep(55, 0.5), LRStep(57, 0.25),
    ]  # fmt: skip
    assert sched.relative_lr_at(27.99) == 1.0
    assert sched.relative_lr_at(28) == 4.0
    assert sched.relative_lr_at(56.9) == 0.5
    assert sched.relative_lr_at(57) == 0.25
    assert sched.stage_at(27.5).index == 3
    assert sched.stage_at(28).index == 4
    with pytest.raises(ValueError):
        sched.stage_at(60)


def test_short_cycle_only():
    # Long cycle off: one base-shape stage per LR stage, cycling (8, 8), (8, 11),
    # (8, 16) with factors 4, 2, 1 (average 7/3). Saving = 20 / (20 / (7/3)) = 7/3;
    # fine-tuning = (30 - 20) / (7/3) * 7/3 = 10; total 30 scaled by 1.5:
    # cumulative 15, 30, 45.
    sched = build_multigrid_schedule(2, 8, 16, [0, 10, 20], 30, long_cycle=False)
    assert [shapes_of(s) for s in sched.stages] == [[(8, 8, 8), (4, 8, 11), (2, 8, 16)]] * 3
    assert sched.iteration_saving == pytest.approx(7 / 3)
    assert ends(sched) == [15, 30, 45]
    # LR: gamma^k * 1; fine-tuning [30, 45) at 0.1 until 37, then 0.01.
    assert sched.lr_steps == [
        LRStep(0, 1.0), LRStep(15, 0.1), LRStep(30, 0.1), LRStep(37, pytest.approx(0.01))
    ]


def test_no_cycles_rounds_half_to_even():
    # Both cycles off: the base schedule stretched by 1.5. Lengths 1 and 2 become
    # 1.5 and 3; cumulative 1.5 and 4.5 round (half to even) to 2 and 4, where
    # rounding halves up would give 2 and 5.
    sched = build_multigrid_schedule(2, 8, 16, [0, 1], 3, long_cycle=False, short_cycle=False)
    assert [shapes_of(s) for s in sched.stages] == [[(2, 8, 16)], [(2, 8, 16)]]
    assert [s.epochs for s in sched.stages] == [1.5, 3.0]
    assert ends(sched) == [2, 4]
    assert sched.lr_steps == [LRStep(0, 1.0), LRStep(2, 1.0), LRStep(3, pytest.approx(0.1))]


def test_factor_lists_and_epoch_factor_are_arguments():
    # Long cycle (1/2, 1), (1, 1): shapes (4, 16) factor 2 and (8, 16) factor 1.
    # LR stage [0, 3) splits 2:1 -> 2, 1 epochs; saving = 3 / (1 + 1) = 1.5;
    # fine-tuning = (6 - 3) / 1.5 = 2. Total 5 scaled to 6 * 1 = 6 by 1.2:
    # cumulative 2.4, 3.6, 6 -> ends 2, 4, 6.
    sched = build_multigrid_schedule(
        2, 8, 16, [0, 3], 6, short_cycle=False,
        long_cycle_factors=[(0.5, 1.0), (1.0, 1.0)], epoch_factor=1.0,
    )  # fmt: skip
    assert [shapes_of(s) for s in sched.stages] == [[(4, 4, 16)], [(2, 8, 16)], [(2, 8, 16)]]
    assert ends(sched) == [2, 4, 6]
    # Short cycle with one extra crop, 3/4 of S = 12: factor round(2048 / (8 * 144))
    # = round(1.78) = 2; base stage cycle (8, 12), (8, 16).
    sched = build_multigrid_schedule(
        2, 8, 16, [0, 3], 6, long_cycle=False, short_cycle_factors=[0.75]
    )
    assert shapes_of(sched.stages[0]) == [(4, 8, 12), (2, 8, 16)]


def test_empty_stages_are_skipped():
    # Long cycle only, LR stage [0, 1), max 2, epoch factor 1: epochs 8/15, 4/15,
    # 2/15, 1/15; saving 1 / (4/15) = 3.75; fine-tuning 1 / 3.75 = 4/15; total
    # 19/15 scaled to 2 by 30/19: cumulative 0.84, 1.26, 1.47, 1.58, 2 -> ends
    # 1, 1, 1, 2, 2. Stages 1, 2 and the fine-tuning stage are empty.
    sched = build_multigrid_schedule(2, 8, 16, [0, 1], 2, short_cycle=False, epoch_factor=1.0)
    assert ends(sched) == [1, 1, 1, 2, 2]
    assert [sched.stage_at(e).index for e in (0, 1)] == [0, 3]
    # Steps of empty intervals are dropped: stage 1 and 2 start where stage 3
    # does; the fine-tuning steps start at the end.
    assert sched.lr_steps == [LRStep(0, 8.0), LRStep(1, 1.0)]


def test_format_table_lists_every_stage():
    sched = build_multigrid_schedule(2, 8, 16, [0, 23], 28)
    table = sched.format_table()
    assert "32x2x8, 16x2x11, 16x2x11" in table
    assert "[39, 42)" in table and "fine-tune" in table
    assert "0.1 from 40" in table


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr_steps=[1, 10], max_epoch=20),  # must start at 0
        dict(lr_steps=[0], max_epoch=20),  # K >= 1
        dict(lr_steps=[0, 10, 10], max_epoch=20),  # increasing
        dict(lr_steps=[0, 20], max_epoch=20),  # fine-tuning stage needed
        dict(lr_steps=[0, 10], max_epoch=20, long_cycle_factors=[(2.0, 2.0)]),  # factor 0
    ],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        build_multigrid_schedule(2, 8, 16, **kwargs)


def test_paper_default_kinetics_shape():
    # SlowFast-style base 8 x 224 (B = 8), steps [0, 44, 88, 118], 196 epochs:
    # the long-cycle shapes are (2, 158), (4, 158), (4, 224), (8, 224) with
    # factors round(8 * 224^2 / (t * s^2)): 8.04 -> 8, 4.02 -> 4, 2, 1.
    sched = build_multigrid_schedule(8, 8, 224, [0, 44, 88, 118], 196)
    assert [(s.num_frames, s.crop_size, s.batch_factor) for s in sched.stages[:4]] == [
        (2, 158, 8), (4, 158, 4), (4, 224, 2), (8, 224, 1)
    ]
    assert sched.max_epoch == round(196 * 1.5)
    assert math.isclose(sum(s.epochs for s in sched.stages), 196 * 1.5)


def test_scale_lr_off_holds_the_base_shapes_lr():
    # The schedule of test_lr_decays_by_gamma_per_lr_stage with scale_lr=False: the same
    # stages and ends, and each stage's LR gamma^k alone (1, then 0.5, fine-tuning 0.25).
    kwargs = dict(gamma=0.5, short_cycle=False)
    scaled = build_multigrid_schedule(2, 8, 16, [0, 15, 30], 40, **kwargs)
    held = build_multigrid_schedule(2, 8, 16, [0, 15, 30], 40, scale_lr=False, **kwargs)
    assert ends(held) == ends(scaled) == [15, 22, 26, 28, 42, 50, 53, 55, 60]
    assert [s.batch_size for s in held.stages] == [s.batch_size for s in scaled.stages]
    assert [s.relative_lr for s in held.stages] == [1.0] * 4 + [0.5] * 5
    assert held.lr_steps == [
        LRStep(0, 1.0), LRStep(15, 1.0), LRStep(22, 1.0), LRStep(26, 1.0),
        LRStep(28, 0.5), LRStep(42, 0.5), LRStep(50, 0.5), LRStep(53, 0.5),
        LRStep(55, 0.5), LRStep(57, 0.25),
    ]  # fmt: skip
