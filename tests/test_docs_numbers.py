"""No result number is typed into the docs: every AP, top-1, difference or spread on the user
pages stands inside a block or an inline value that ``python study/study_report.py`` writes
from the CSVs (``--check``, in study/tests/test_report.py, keeps those current). A typed one
goes stale when the rows change.

A result number, as this test reads the text outside generated blocks, inline values and
code: a signed decimal with two places (a difference, ``-0.32``), one of 10 or more with two
places (an AP or a top-1, ``83.14``), or a spread after ``±``. Learning rates, weight decays
and shares of the data (``0.02``, ``1.04%``) are not results and do not match. The study's
log (docs/study_log.md) is a dated record of readings against the baselines of their day,
and is not a reference page: it is left out."""

import glob
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAGES = sorted(
    [p for p in glob.glob(os.path.join(ROOT, "docs", "*.md")) if not p.endswith("study_log.md")]
    + [os.path.join(ROOT, p) for p in ("README.md", "projects/video/README.md", "study/README.md",
                                       "benchmarks/RESULTS.md")]  # fmt: skip
)
#: (page, number) pairs that match the pattern but are not results; none today
ALLOWED: set = set()

_BLOCK = re.compile(r"<!-- BEGIN generated (\S+) -->.*?<!-- END generated \1 -->", re.S)
_INLINE = re.compile(r"<!--v \S+?-->.*?<!--/v-->")
_FENCED = re.compile(r"```.*?```", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_RESULT = re.compile(r"(?<![\w.])(?:[+\-−]\d+\.\d{2}|\d{2,}\.\d{2}|±\s*\d+\.\d{2})(?![\w.])")


def typed_results(text: str):
    """The result numbers of ``text`` outside generated blocks, inline values and code."""
    for pattern in (_BLOCK, _INLINE, _FENCED, _CODE):
        text = pattern.sub("", text)
    return _RESULT.findall(text)


def test_the_check_finds_a_typed_result_and_passes_a_generated_one():
    assert typed_results("PMD-LAMB is -0.32 below, at 83.14 ± 0.12 AP.") == ["-0.32", "83.14", "± 0.12"]
    assert typed_results("LR 0.02 at 1.04% of N, weight decay 0.01, 1.39x faster, Python 3.10") == []
    generated = ("<!-- BEGIN generated regime-verdict -->\n- -0.32 [-0.55, -0.09]\n<!-- END generated regime-verdict -->\n"
                 "held-out <!--v regime/baseline/mean/holdout_ap-->83.14<!--/v--> and `sd 0.30`")  # fmt: skip
    assert typed_results(generated) == []


def test_no_result_number_is_typed_into_a_user_page():
    typed = []
    for page in PAGES:
        rel = os.path.relpath(page, ROOT)
        with open(page, encoding="utf-8") as f:
            typed += [f"{rel}: {n}" for n in typed_results(f.read()) if (rel, n) not in ALLOWED]
    assert not typed, "result numbers typed outside a generated block:\n" + "\n".join(typed)
