"""The ``cuda-tests`` step's output: pytest's JUnit XML of ``tests/cuda``."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

from .step import Figures


def parse_pytest(output: str, out: str) -> Figures:
    """Counts from the JUnit XML of ``pytest --junitxml {out}/cuda-tests.xml``, and the
    names of the tests that failed."""
    root = ET.parse(os.path.join(out, "cuda-tests.xml")).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}  # beside the outcome: system-out, properties
        outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        if outcome in ("failure", "error"):
            counts["failed" if outcome == "failure" else "errors"] += 1
            failed.append(name)
        elif outcome == "skipped":
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failed_tests": failed}


def summarize_pytest(f: Figures) -> str:
    text = (
        f"{f['passed']} passed, {f['failed']} failed, {f['errors']} errors, {f['skipped']} skipped"
    )
    if f.get("failed_tests"):
        text += "; failed: " + ", ".join(f["failed_tests"])
    return text
