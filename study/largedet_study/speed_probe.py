"""A machine-speed probe beside a timed study cell: a fixed convolution's forward and backward
pass, timed in the study process just before a cell's training starts and just after it ends
(each invocation, a resumed cell's too), written to ``<run dir>/speed_probe.json``.

Two VMs of one machine class (one CPU model, one size) can differ in speed by a factor, or one
VM can change speed between days (neighbours on the host): wall-clock comparisons between
cells (multigrid's speed-up over the plain schedule, :mod:`largedet_study.mg_time_report`)
hold only between runs at one speed. The probe says which runs those are: the report leaves
out a row with a probe more than a factor :data:`FACTOR` from its reference's median probe.

The probe is an instant's measure: with a second study process on the other core it reads
the neighbour's load as well as the VM's speed (the mg_time grid's rows on one Xeon-AMX VM in
one session: 17 to 31 ms, the report prints the range), so the bound is a factor, which a VM
at another speed crosses and a neighbour's load does not; a tighter one would leave out rows
for what the seeds' spread already carries.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from typing import Dict, List

__all__ = ["FACTOR", "PROBE_FILE", "measure", "read", "record", "reset", "row_columns"]

PROBE_FILE = "speed_probe.json"
#: a row's probes may stand up to this factor above or below the reference's median probe
FACTOR = 1.5
#: the probe: a 3x3 convolution of 32 to 32 channels on 16 maps of 32x32 (about 0.9 GFLOP a
#: forward and backward pass), as many passes a repeat, the median of the repeats
SHAPE, PASSES, REPEATS = (16, 32, 32, 32), 10, 5


def measure(threads: int = 1) -> float:
    """Milliseconds of one forward and backward pass of the probe's convolution on ``threads``
    torch threads (the median of :data:`REPEATS` repeats of :data:`PASSES` passes, after one
    untimed pass)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(*SHAPE, generator=gen, requires_grad=True)
        weight = torch.randn(SHAPE[1], SHAPE[1], 3, 3, generator=gen, requires_grad=True)

        def one_pass():
            torch.nn.functional.conv2d(x, weight, padding=1).square().mean().backward()

        one_pass()
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(PASSES):
                one_pass()
            times.append((time.perf_counter() - start) / PASSES * 1000.0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


def read(run_dir: str) -> List[Dict]:
    """The probes recorded in ``run_dir`` ([] where none)."""
    path = os.path.join(run_dir, PROBE_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def reset(run_dir: str) -> None:
    """Forget the probes of ``run_dir`` (a cell that starts again from step 0)."""
    path = os.path.join(run_dir, PROBE_FILE)
    if os.path.exists(path):
        os.remove(path)


def record(run_dir: str, when: str, threads: int = 1, ms: float = None) -> Dict:
    """Measure (or take ``ms``) and append one probe, ``when`` "start" or "end", with the UTC
    time, to ``run_dir``'s probe file; returns it."""
    if when not in ("start", "end"):
        raise ValueError(f"when must be 'start' or 'end', got {when!r}")
    entry = {
        "when": when,
        "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ms": round(measure(threads) if ms is None else ms, 3),
        "threads": threads,
    }
    entries = read(run_dir) + [entry]
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, PROBE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(entries, f, indent=1)
    os.replace(tmp, os.path.join(run_dir, PROBE_FILE))
    return entry


def row_columns(run_dir: str) -> Dict[str, str]:
    """A CSV row's probe columns: ``started_utc`` (the first probe's time), ``probe_ms_min`` and
    ``probe_ms_max`` over the run's probes; "" each where the run has none."""
    entries = read(run_dir)
    if not entries:
        return {"started_utc": "", "probe_ms_min": "", "probe_ms_max": ""}
    values = [e["ms"] for e in entries]
    return {"started_utc": entries[0]["utc"], "probe_ms_min": f"{min(values):.3f}",
            "probe_ms_max": f"{max(values):.3f}"}  # fmt: skip
