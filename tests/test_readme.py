"""The README stays a front page: at most 150 lines, its results table generated from the
study CSVs (the numbers themselves are checked by study/tests/test_report.py)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_readme_is_at_most_150_lines():
    assert len(_readme().splitlines()) <= 150


def test_readme_results_are_a_generated_block_and_its_two_commands_are_there():
    text = _readme()
    block = re.search(r"<!-- BEGIN generated results-summary -->\n(.*?)<!-- END generated results-summary -->", text, re.S)
    assert block and block.group(1).count("\n| ") >= 3  # a header, a rule and rows
    assert "make demo" in text and "make test" in text
    # outside generated parts, no AP or top-1 figure of the study is typed into the README
    outside = re.sub(r"<!-- BEGIN generated (\S+) -->.*?<!-- END generated \1 -->", "", text, flags=re.S)
    outside = re.sub(r"```.*?```", "", outside, flags=re.S)
    assert not re.findall(r"\b\d{2}\.\d{2}\b", outside)
