"""Where a run's derived numbers are written: the scaled LR, K and the per-device batch are
computed in ``largedet/solver/plan.py`` and ``largedet/solver/batch.py`` only, and every
builder takes the run plan as a required argument (no ``plan=None``, no
``Optional[RunPlan]``). A grep over the sources of the library, the video project, the
tools and the studies."""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FOLDERS = ("largedet", "projects/video/largedet_video", "projects/video/train.py", "tools", "benchmarks",
           "projects/video/benchmarks", "study")  # fmt: skip
ALLOWED = {"largedet/solver/plan.py", "largedet/solver/batch.py"}

#: what each pattern finds: the LSR's formula, K, the per-device batch from the global one
ARITHMETIC = {
    "the scaling rule's formula": re.compile(r"LSR_RULES\[|math\.sqrt\(\s*\w*batch|REFERENCE_LR\s*\*"),
    "K from the global batch": re.compile(r"(IMS_PER_BATCH|global_batch|\btotal)\s*//\s*\("),
    "the per-device batch": re.compile(r"min\(\s*\w+,\s*\w*batch\w*\s*//\s*world"),
}
OPTIONAL_PLAN = re.compile(r"plan\s*=\s*None|Optional\[RunPlan\]|plan: RunPlan\s*\|\s*None")


def _sources():
    for folder in FOLDERS:
        path = os.path.join(ROOT, folder)
        if os.path.isfile(path):
            yield folder, path
            continue
        for dirpath, _, files in os.walk(path):
            for name in files:
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    yield os.path.relpath(full, ROOT).replace(os.sep, "/"), full


def _found(pattern):
    hits = []
    for rel, full in _sources():
        for number, line in enumerate(open(full, encoding="utf-8"), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                hits.append((rel, number, line.strip()))
    return hits


def test_the_sources_are_read():
    files = dict(_sources())
    assert "largedet/solver/plan.py" in files and "largedet/engine/trainer.py" in files
    assert "study/largedet_study/grid.py" in files


@pytest.mark.parametrize("what", sorted(ARITHMETIC))
def test_derived_numbers_are_computed_in_the_plan_only(what):
    hits = _found(ARITHMETIC[what])
    assert {rel for rel, _, _ in hits} <= ALLOWED, [h for h in hits if h[0] not in ALLOWED]
    assert any(rel in ALLOWED for rel, _, _ in hits), f"the plan no longer holds {what}?"


def test_the_run_plan_is_a_required_argument():
    assert _found(OPTIONAL_PLAN) == []


def test_the_patterns_find_what_they_look_for():
    assert ARITHMETIC["K from the global batch"].search("k = cfg.SOLVER.IMS_PER_BATCH // (world * n)")
    assert not ARITHMETIC["K from the global batch"].search("done = position // (world_size * batch_size)")
    assert ARITHMETIC["the per-device batch"].search("return min(most, global_batch // world_size)")
    assert ARITHMETIC["the scaling rule's formula"].search("return reference_lr * LSR_RULES[rule](b / r)")
    assert OPTIONAL_PLAN.search("def build(cfg, plan=None):")
    assert OPTIONAL_PLAN.search("plan: Optional[RunPlan] = None")
