"""Every relative link of the README, the pages under docs/ and the other manuals resolves:
the file (or folder) exists, and an anchor (``page.md#section``) names a heading of that
page, slugged as GitHub does."""

import glob
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAGES = sorted(
    os.path.relpath(p, ROOT)
    for p in [
        os.path.join(ROOT, "README.md"),
        *glob.glob(os.path.join(ROOT, "docs", "*.md")),
        os.path.join(ROOT, "benchmarks", "RESULTS.md"),
        os.path.join(ROOT, "projects", "video", "README.md"),
        os.path.join(ROOT, "study", "README.md"),
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = heading.strip().lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: str) -> set:
    found, in_code = set(), False
    for line in open(path).read().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"^#{1,6} ", line):
            found.add(slug(line))
    return found


def links(path: str) -> list:
    text, in_code, out = open(path).read().splitlines(), False, []
    for line in text:
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            out.extend(LINK.findall(line))
    return out


def test_slugs_follow_github():
    assert slug("### Model EMA, batch ramp, warm-up-stable-decay") == "model-ema-batch-ramp-warm-up-stable-decay"
    assert slug("## GPU grid (not yet run)") == "gpu-grid-not-yet-run"


# The documentation site's own pages (docs/conf.py): its root, whose tables of contents list
# the others, and the page that includes the video project's README
SITE_PAGES = {os.path.join("docs", "index.md"), os.path.join("docs", "video.md")}


def test_the_docs_pages_exist_and_the_readme_links_each():
    pages = {p for p in PAGES if p.startswith("docs" + os.sep)} - SITE_PAGES
    assert len(pages) >= 5
    readme_links = {os.path.normpath(t.partition("#")[0]) for t in links(os.path.join(ROOT, "README.md"))}
    assert pages <= readme_links


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    path = os.path.join(ROOT, page)
    broken = []
    for target in links(path):
        if re.match(r"^[a-z]+:", target):
            continue  # https://, mailto:
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(resolved):
            broken.append(f"{target}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in headings(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page}: " + "; ".join(broken)
