"""The wall clock by stage (largedet_video.engine.stage_times): step keys and voxels, the
summary's sums, medians and per-voxel costs, the file's invocations."""

import pytest

from largedet_video.engine.stage_times import (
    StageTimes,
    StepShapes,
    append_stage_times,
    format_stage_times,
    read_stage_times,
    step_shapes,
)


def test_step_shapes():
    one = step_shapes([(16, 8, 32)])
    assert (one.key, one.voxels, one.epoch_start) == ("16x8x32", 16 * 8 * 32 * 32, False)
    # accumulated batches: counted per shape, in order of first appearance
    mixed = step_shapes([(64, 8, 16), (32, 8, 23), (64, 8, 16)], epoch_start=True)
    assert mixed.key == "2*64x8x16 + 32x8x23"
    assert mixed.voxels == 2 * 64 * 8 * 16 * 16 + 32 * 8 * 23 * 23 == 397568
    assert mixed.epoch_start


def test_summary_numbers():
    times = StageTimes()
    times.add_step(StepShapes("a", 100, True), 0.5, 0.1)
    times.add_step(StepShapes("a", 100), 0.3, 0.1)
    times.add_step(StepShapes("b", 50), 0.2, 0.0)
    s = times.summary(2.0, precise_bn_s=0.4, precise_bn_passes=1, evaluation_s=0.3)
    assert (s["step_s"], s["data_s"], s["epoch_starts"], s["epoch_start_data_s"]) == (1.0, 0.2, 1, 0.1)
    assert s["other_s"] == pytest.approx(0.3)  # 2.0 - 1.0 - 0.4 - 0.3
    a, b = s["steps"]["a"], s["steps"]["b"]
    # medians of (0.5, 0.3) and of the compute times (0.4, 0.2); per million voxels
    assert (a["steps"], a["step_s"], a["data_s"], a["median_step_ms"], a["median_compute_ms"]) == (
        2, 0.8, 0.2, 400.0, 300.0)
    assert a["compute_ms_per_mvoxel"] == pytest.approx(0.3e3 / 100e-6)
    assert (b["median_compute_ms"], b["compute_ms_per_mvoxel"]) == (200.0, pytest.approx(0.2e3 / 50e-6))
    text = format_stage_times(s)
    # b's cost per voxel over a's (the most-voxel shape): 4e6 / 3e6
    assert "(1.33x)" in text and "(1.00x)" in text and "precise BN (1 passes)" in text


def test_invocations_append(tmp_path):
    assert read_stage_times(str(tmp_path)) == []
    append_stage_times(str(tmp_path), {"wall_s": 1.0})
    append_stage_times(str(tmp_path), {"wall_s": 2.0})
    assert read_stage_times(str(tmp_path)) == [{"wall_s": 1.0}, {"wall_s": 2.0}]
