"""Every Sphinx-style reference in the code's docstrings and comments (``:mod:``, ``:func:``,
``:class:``, ``:data:``, ``:meth:``, ``:attr:`` followed by a backquoted name) names
something that exists: a dotted name importable from the installed packages, or a name
defined in (or imported into) the module that writes it."""

import importlib
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
VIDEO = os.path.join(ROOT, "projects", "video")
ROLE = re.compile(r":(mod|func|class|data|meth|attr|exc):`~?([A-Za-z_][\w.]*)`")
# (folder, the package name it holds, or None for scripts)
SOURCES = (("largedet", "largedet"), (os.path.join("projects", "video", "largedet_video"), "largedet_video"),
           (os.path.join("study", "largedet_study"), "largedet_study"),
           (os.path.join("study", "video_study"), "video_study"),
           ("tools", None), ("benchmarks", None), (os.path.join("projects", "video", "benchmarks"), None),
           ("study", None))  # fmt: skip


def _module_name(path: str, folder: str, package: str) -> str:
    rel = os.path.relpath(path, os.path.join(ROOT, folder))[: -len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join([package, *rel])


def _has(obj, name: str) -> bool:
    """``obj.name`` exists, or ``name`` is a field a class declares (dataclass fields and
    annotated attributes have no class attribute without a default)."""
    if hasattr(obj, name):
        return True
    return isinstance(obj, type) and any(name in getattr(c, "__annotations__", {}) for c in obj.__mro__)


def _resolve(target: str, namespace, source: str = "") -> bool:
    parts = target.split(".")
    # a name of the module itself (or imported into it): Class, Class.method, CONSTANT
    obj, found = namespace, namespace is not None
    for part in parts:
        if obj is None or not _has(obj, part):
            found = False
            break
        obj = getattr(obj, part, None)
    if found:
        return True
    # an instance attribute the module's code sets: ``self.phi = ...``
    if len(parts) == 1 and re.search(rf"\bself\.{re.escape(parts[0])}\s*(?::[^=]+)?=[^=]", source):
        return True
    # a method or attribute named inside its class's docstrings: ``:meth:`update```
    if namespace is not None and len(parts) == 1:
        classes = [v for v in vars(namespace).values()
                   if isinstance(v, type) and v.__module__ == namespace.__name__]  # fmt: skip
        if any(_has(c, parts[0]) for c in classes):
            return True
    # a dotted name: the longest importable prefix, then attributes
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


def _references():
    seen = set()
    for folder, package in SOURCES:
        for root, _, files in os.walk(os.path.join(ROOT, folder)):
            if os.path.basename(root) == "tests":  # the study's tests: not library docs
                continue
            for name in sorted(files):
                if name.endswith(".py") and os.path.join(root, name) not in seen:
                    path = os.path.join(root, name)
                    seen.add(path)
                    with open(path) as f:
                        text = f.read()
                    for m in ROLE.finditer(text):
                        yield path, folder, package, m.group(1), m.group(2), text


def test_every_docstring_reference_resolves():
    if VIDEO not in sys.path:
        sys.path.insert(0, VIDEO)
    broken, modules = [], {}
    for path, folder, package, role, target, text in _references():
        if path not in modules:
            modules[path] = importlib.import_module(_module_name(path, folder, package)) if package else None
        if not _resolve(target, modules[path], text):
            broken.append(f"{os.path.relpath(path, ROOT)}: :{role}:`{target}`")
    assert not broken, "references to nothing:\n" + "\n".join(broken)


def test_the_check_finds_a_broken_reference():
    import largedet_study.grid as grid

    assert _resolve("largedet.solver.plan.LSR_RULES", grid)
    assert _resolve("Cell.name", grid) and _resolve("plan_cell", grid)
    assert not _resolve("largedet.utils.study", grid)
    assert not _resolve("largedet.solver.LSR_RULE", grid)
    assert not _resolve("Cell.nonexistent", grid)
    assert _resolve("name", grid) and not _resolve("nothing_of_the_kind", grid)  # Cell.name
    assert _resolve("Grid.num_train", grid)  # a dataclass field without a default
    assert _resolve("phi", None, "        self.phi = {}") and not _resolve("phi", None, "self.phi == 1")
