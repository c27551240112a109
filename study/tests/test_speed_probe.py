"""largedet_study.speed_probe: the probe's measurement and its file."""

import math

import pytest
import torch

from largedet_study import speed_probe


def test_the_probe_times_the_convolution_and_puts_the_threads_back():
    before = torch.get_num_threads()
    ms = speed_probe.measure(threads=1)
    assert math.isfinite(ms) and 0.0 < ms < 60_000.0
    assert torch.get_num_threads() == before


def test_records_append_and_a_reset_forgets_them(tmp_path):
    run = str(tmp_path / "cell")
    assert speed_probe.read(run) == [] and speed_probe.row_columns(run) == {
        "started_utc": "", "probe_ms_min": "", "probe_ms_max": ""}  # fmt: skip
    first = speed_probe.record(run, "start", ms=12.3456)
    speed_probe.record(run, "end", ms=11.0)
    assert first["ms"] == 12.346 and first["threads"] == 1
    assert [(e["when"], e["ms"]) for e in speed_probe.read(run)] == [("start", 12.346), ("end", 11.0)]
    assert speed_probe.row_columns(run) == {"started_utc": first["utc"], "probe_ms_min": "11.000",
                                            "probe_ms_max": "12.346"}  # fmt: skip
    speed_probe.reset(run)
    assert speed_probe.read(run) == []
    with pytest.raises(ValueError, match="'start' or 'end'"):
        speed_probe.record(run, "middle", ms=1.0)
