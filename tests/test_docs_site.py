"""The documentation site (docs/conf.py, ``make docs``) builds with warnings as errors, its
links and figures resolve, and its reference pages document what the code declares: every
public name of the documented packages, every optimizer and hook, every config key.

The site is built once per session, into a temporary folder (about 30-60 s)."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
VIDEO = os.path.join(ROOT, "projects", "video")
if VIDEO not in sys.path:
    sys.path.insert(0, VIDEO)

# The packages whose public names (``__all__``) the reference pages document, and the page
PACKAGES = {
    "largedet.optim": "reference/optim",
    "largedet.solver": "reference/solver",
    "largedet.engine": "reference/engine",
    "largedet.launch.processes": "reference/launch",
    "largedet.launch.job": "reference/launch",
    "largedet.launch.preemption": "reference/launch",
    "largedet.launch.run_summary": "reference/launch",
    "largedet.launch.slurm": "reference/launch",
    "largedet.data": "reference/data",
    "largedet.evaluation": "reference/evaluation",
    "largedet.config": "reference/config",
    **{p: "reference/video" for p in ("largedet_video", "largedet_video.config", "largedet_video.data",
                                      "largedet_video.modeling", "largedet_video.layers",
                                      "largedet_video.engine", "largedet_video.evaluation",
                                      "largedet_video.multigrid")},
}  # fmt: skip


class _Page(HTMLParser):
    """A built page's ids, links (href, src) and images."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images = set(), [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name):
                self.links.append(attrs[name])
        if tag == "img":
            self.images.append(attrs.get("src", ""))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    env = {k: v for k, v in os.environ.items() if k != "LARGEDET_SOURCE_URL"}
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
               "-d", str(out / "doctrees"), os.path.join(ROOT, "docs"), str(out / "html")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0 and not warnings, "sphinx-build:\n" + "\n".join(warnings or [result.stderr])
    html = out / "html"
    pages = {}
    for folder, _, files in os.walk(html):
        for name in files:
            if name.endswith(".html") and "_modules" not in folder:
                path = os.path.join(folder, name)
                parser = _Page()
                with open(path, encoding="utf-8") as f:
                    parser.feed(f.read())
                pages[os.path.relpath(path, html)[: -len(".html")].replace(os.sep, "/")] = parser
    return html, pages


def _text(site, page):
    with open(os.path.join(site[0], page + ".html"), encoding="utf-8") as f:
        return f.read()


def test_every_guide_page_is_on_the_site(site):
    _, pages = site
    guide = {os.path.splitext(n)[0] for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")}
    assert guide <= set(pages)
    assert {"index", "video", "reference/config", "reference/optim", "reference/engine"} <= set(pages)
    # the video project's README, included where it is
    assert "Temporal Shift Module" in _text(site, "video")


def test_every_relative_link_and_anchor_resolves(site):
    html, pages = site
    broken = []
    for name, page in pages.items():
        here = os.path.dirname(os.path.join(html, name + ".html"))
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue
            target = os.path.normpath(os.path.join(here, unquote(parts.path))) if parts.path else None
            if target and not os.path.exists(target):
                broken.append(f"{name}: {link}")
            elif parts.fragment and (target is None or target.endswith(".html")):
                linked = pages.get(name) if target is None else pages.get(
                    os.path.relpath(target, html)[: -len(".html")].replace(os.sep, "/"))  # fmt: skip
                if linked is not None and unquote(parts.fragment) not in linked.ids:
                    broken.append(f"{name}: {link} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(sorted(set(broken)))


def test_every_figure_shown_exists(site):
    html, pages = site
    shown = [(name, src) for name, page in pages.items() for src in page.images]
    figures = [(n, s) for n, s in shown if s.endswith(".png")]
    # the study's and the video README's figures are on the site
    assert {n for n, _ in figures} >= {"study", "video"}
    for name, src in figures:
        path = os.path.normpath(os.path.join(os.path.dirname(os.path.join(html, name + ".html")), unquote(src)))
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name}: {src} is not a PNG"


def _documented(site):
    return set().union(*(p.ids for n, p in site[1].items() if n.startswith("reference/")))


def test_every_public_name_is_documented(site):
    ids = _documented(site)
    missing = []
    for package, page in PACKAGES.items():
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            candidates = {f"{package}.{name}", f"{getattr(obj, '__module__', package)}.{name}"}
            if not candidates & ids:
                missing.append(f"{package}.{name} ({page})")
    assert not missing, "not in the API reference:\n" + "\n".join(missing)


def _public_classes(package: str, base: type):
    """class -> its exported names, for every subclass of ``base`` in the ``__all__`` of
    ``package`` or of one of its public submodules."""
    root = importlib.import_module(package)
    names = [m.name for m in pkgutil.walk_packages(root.__path__, package + ".") if "._" not in m.name]
    modules = [root] + [importlib.import_module(name) for name in names]
    found = {}
    for module in modules:
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, base):
                found.setdefault(obj, set()).add(f"{module.__name__}.{name}")
    return found


def test_every_optimizer_and_hook_is_documented(site):
    import torch
    from detectron2.engine import HookBase

    from largedet.solver import OPTIMIZER_REGISTRY

    ids = _documented(site)
    optimizers = _public_classes("largedet.optim", torch.optim.Optimizer)
    assert {c.__name__ for c in optimizers} >= {"PMDLAMB", "LAMB", "LARS"}
    assert "largedet.optim.AGVM" in site[1]["reference/optim"].ids  # per-part LR, not an Optimizer
    hooks = {**_public_classes("largedet.engine", HookBase), **_public_classes("largedet.launch", HookBase),
             **_public_classes("largedet_video.engine", HookBase)}  # fmt: skip
    assert len(hooks) >= 8
    missing = [min(names) for names in {**optimizers, **hooks}.values() if not names & ids]
    assert not missing, "not in the API reference: " + ", ".join(missing)
    # each name SOLVER.OPTIMIZER takes, in the optimizers page's table
    page = _text(site, "reference/optim")
    for name, _ in OPTIMIZER_REGISTRY:
        assert f'<span class="pre">{name}</span>' in page, name


def _added_keys(add, base):
    def flat(cfg, prefix=""):
        out = {}
        for k, v in cfg.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    before, after = flat(base()), flat(add(base()))
    return {k: v for k, v in after.items() if before.get(k, object()) != v}


def test_every_declared_key_is_in_the_config_reference(site):
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet_video.config import add_video_config

    page = _text(site, "reference/config")
    documented = re.findall(r'<dt class="sig sig-object std" id="confkey-([^"]+)">', page)
    largedet_keys = _added_keys(add_largedet_config, get_cfg)
    video_keys = _added_keys(add_video_config, lambda: add_largedet_config(get_cfg()))
    assert len(largedet_keys) > 50 and len(video_keys) > 30
    assert not set(largedet_keys) - set(documented), sorted(set(largedet_keys) - set(documented))
    assert not set(video_keys) - set(documented), sorted(set(video_keys) - set(documented))
    # and Detectron2's keys that largedet checks or maps
    from largedet.config.keys import DETECTRON2_KEYS

    for key, _, _ in DETECTRON2_KEYS:
        assert f'<span class="pre">{key}</span>' in page, key
    # each entry gives its default and where it is declared
    entry = page[page.index('id="confkey-SOLVER.PMD.PERIOD"'):][:3000]
    assert "<code" in entry and ">200<" in entry and "largedet/config/defaults.py:" in entry
