"""The documentation site's generated pages and its links into the repository.

Three things Sphinx does not do by itself:

* **Generated sections.** A page holds a placeholder block, replaced when the page is read
  (``source-read``) by MyST text made from the code::

      ```{largedet-api} largedet.engine
      :submodules: hooks preemption
      :exclude-modules: launch
      ```

  documents the package's public names (its ``__all__``), then the public names of the
  listed submodules that the package does not re-export, each under a heading;
  ``:exclude-modules:`` leaves out objects defined in those submodules (documented on
  another page). ``{largedet-config-keys} largedet_video`` lists the keys a project adds to
  Detectron2's config (:func:`declared_keys`), ``{largedet-detectron2-keys}`` the keys of
  Detectron2's that largedet checks or maps, ``{largedet-optimizer-registry}`` the names
  ``SOLVER.OPTIMIZER`` takes, ``{largedet-table} MODULE.NAME`` a tuple of dataclass rows.
* **Config keys as objects**: ``confkey`` entries, with an index entry and an anchor,
  referenced as ``{confkey}`\\`SOLVER.PMD.PERIOD\\```.
* **Links to repository files outside docs/** (configs, CSVs, run folders, the scripts):
  links from the pages (and from the video project's README, included by ``video.md``) to a
  file or folder of the repository that is not a page become links to that path: relative to
  the built page (the checkout read in a browser) or, with ``largedet_source_url`` set (e.g.
  ``https://github.com/<owner>/largedet/blob/main``), to the hosted repository.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)

# ```{name} argument
# :option: value
# ```
PLACEHOLDER = re.compile(r"^```\{(largedet-[\w-]+)\}[ \t]*(.*?)\n((?::[\w-]+:.*\n)*)```[ \t]*$", re.M)

# --- config keys ------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyDoc:
    """One config key as its declaration says: default, comment, where it is declared."""

    key: str
    default: Any
    comment: str  # the comment above the declaration, one paragraph
    path: str  # the declaring file, relative to the repository
    line: int
    need: Optional[str] = None  # the declared value rule, in words
    lazy: Optional[str] = None  # the LazyConfig name: train.<lazy>

    @property
    def meaning(self) -> str:
        """The comment's first clause: up to the first ``.``, ``:`` or ``;`` that ends a word
        outside brackets (not ``e.g.``, ``i.e.``, ``et al.``); not at a ``:`` or ``;`` that
        leaves fewer than four words ("Batch ramp: ..."); at most ~160 characters."""
        depth, text = 0, self.comment
        for i, char in enumerate(text):
            depth += (char in "([{") - (char in ")]}")
            ends_word = i + 1 == len(text) or text[i + 1] == " "
            words = len(text[:i].split())
            if depth == 0 and ends_word and (char == "." or (char in ":;" and words >= 4)):
                if not re.search(r"(\be\.g|\bi\.e|\bal|\betc)$", text[:i]):
                    text = text[:i]
                    break
        text = text.strip().rstrip(".")
        return text if len(text) <= 160 else text[:157].rsplit(" ", 1)[0] + " ..."

    @property
    def type_name(self) -> str:
        return _type_name(self.default)


def _type_name(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        inner = sorted({_type_name(v) for v in value})
        container = type(value).__name__
        return f"{container}[{' | '.join(inner)}]" if inner else container
    return type(value).__name__


def _flatten(cfg, prefix="") -> Dict[str, Any]:
    out = {}
    for name, value in cfg.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _dotted(node) -> Optional[str]:
    """``cfg.A.B`` -> ``"A.B"``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "cfg" and parts:
        return ".".join(reversed(parts))
    return None


def _declared_key(stmt) -> Optional[str]:
    """The key a statement of an ``add_*_config`` function sets: ``cfg.A.B = ...`` or
    ``declare(cfg, "A.B", ...)``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        return _dotted(stmt.targets[0])
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if getattr(call.func, "id", None) == "declare" and len(call.args) >= 2:
            if isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
                return call.args[1].value
    return None


def _comment_above(lines: List[str], lineno: int) -> str:
    """The comment block ending on the line above ``lineno`` (1-based): its last paragraph
    (paragraphs are parted by a bare ``#``), without ``# --- heading ---`` lines."""
    block = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        block.append(lines[i].strip()[1:].strip())
        i -= 1
    block.reverse()
    if "" in block:
        block = block[len(block) - block[::-1].index(""):]
    return " ".join(line for line in block if line and not line.startswith("---"))


def _statements(module) -> Dict[str, Tuple[int, str]]:
    """key -> (line, comment) for every key the module's functions set. A key with no comment
    of its own right below another one shares that one's (``NUM_TRAIN`` / ``NUM_VAL``)."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    found: Dict[str, Tuple[int, str]] = {}
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        previous = None
        for stmt in func.body:
            key = _declared_key(stmt)
            if key is None:
                previous = None
                continue
            comment = _comment_above(lines, stmt.lineno)
            if not comment and previous is not None and previous[0] == stmt.lineno - 1:
                comment = previous[1]
            found.setdefault(key, (stmt.lineno, comment))
            previous = (stmt.end_lineno, comment)
    return found


def declared_keys(add_config: Callable, base: Callable, rules=()) -> List[KeyDoc]:
    """Every leaf key ``add_config`` sets on the config ``base()`` returns (a key it adds,
    or one whose default it changes, or one its module assigns), in declaration order, each
    with its declared rule or, for a key declared without one, its rule among ``rules``
    (those of the rooms that own what a key names).

    Raises:
        ValueError: a key that ``add_config`` adds or changes is set outside its module's
            ``add_*`` functions, or has no comment above it.
    """
    from largedet.config.keys import DETECTRON2_KEYS, LARGEDET_KEYS

    module = sys.modules[add_config.__module__]
    registry = getattr(module, "VIDEO_KEYS", LARGEDET_KEYS)
    before = _flatten(base())
    after = _flatten(add_config(base()))
    changed = {k for k, v in after.items() if k not in before or before[k] != v}
    # the module's own statements, then those of the add_*_config functions of its package
    # that it calls (largedet.config.agvm_keys for largedet.config.defaults)
    package = module.__name__.rpartition(".")[0]
    parts = [module] + [
        sys.modules[f.__module__] for f in vars(module).values()
        if inspect.isfunction(f) and f.__name__.startswith("add_") and f.__name__.endswith("_config")
        and f.__module__ != module.__name__ and f.__module__.rpartition(".")[0] == package
    ]  # fmt: skip
    statements = {}
    for order, part in enumerate(parts):
        path = os.path.relpath(inspect.getsourcefile(part), ROOT)
        for key, (line, comment) in _statements(part).items():
            statements.setdefault(key, (line, comment, path, order))
    missing = sorted(changed - set(statements))
    uncommented = sorted(k for k in changed & set(statements) if not statements[k][1])
    if missing or uncommented:
        raise ValueError(f"{module.__name__}: keys set elsewhere {missing}; without a comment {uncommented}")
    lazy = {key: name for name, key in registry.train_keys.items()}
    if registry is LARGEDET_KEYS:
        lazy.update({key: name for key, _, name in DETECTRON2_KEYS if name})
    docs = []
    for key, (line, comment, path, _) in sorted(statements.items(), key=lambda kv: (kv[1][3], kv[1][0])):
        if key not in after:  # a CfgNode
            continue
        rule = registry.rules.get(key) or next((r for r in rules if r.key == key), None)
        docs.append(KeyDoc(key, after[key], comment, path, line, rule.need if rule else None, lazy.get(key)))
    return docs


def _project_keys(project: str) -> List[KeyDoc]:
    from detectron2.config import get_cfg

    if project == "largedet":
        from largedet.config import add_largedet_config

        return declared_keys(add_largedet_config, get_cfg)
    if project == "largedet_video":
        from largedet.config import add_largedet_config
        from largedet_video.config import add_video_config
        from largedet_video.engine.checks import VIDEO_RULES

        return declared_keys(add_video_config, lambda: add_largedet_config(get_cfg()), VIDEO_RULES)
    raise ValueError(f"no key registry for {project!r}")


# --- MyST text --------------------------------------------------------------------------

_ESCAPE = re.compile(r"([\\*_<>\[\]|#$])")


def _md(text: str) -> str:
    """Plain text (a comment, a docstring line) as MyST: markup characters escaped, code
    quoted with backquotes kept."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(p if p.startswith("`") and p.endswith("`") else _ESCAPE.sub(r"\\\1", p) for p in parts)


def _code(value: str) -> str:
    fence = "``" if "`" in value else "`"
    return f"{fence} {value} {fence}" if fence == "``" else f"`{value}`"


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _source_link(path: str, line: int) -> str:
    return f"[{path}:{line}](source:{path}#L{line})"


def config_keys_page(project: str) -> str:
    """The key reference of a project, as MyST: per top-level key a section with a summary
    table and one ``confkey`` entry per key."""
    keys = _project_keys(project)
    groups: Dict[str, List[KeyDoc]] = {}
    for doc in keys:
        groups.setdefault(doc.key.split(".")[0] if "." in doc.key else "(top level)", []).append(doc)
    out = []
    for group, docs in groups.items():
        out += [f"### {group}", "", "| Key | Default | Meaning |", "| --- | --- | --- |"]
        out += [f"| {{confkey}}`{d.key}` | {_md(_code(_short(d.default, 24)))} | {_md(d.meaning)} |" for d in docs]
        out.append("")
        for d in docs:
            out += [f"```{{confkey}} {d.key}", "```", "", _md(d.comment), ""]
            fields = [("Default", _code(repr(d.default))), ("Type", _code(d.type_name))]
            if d.need:
                fields.append(("Allowed", _md(d.need)))
            if d.lazy:
                fields.append(("LazyConfig", _code(f"train.{d.lazy}")))
            fields.append(("Declared", _source_link(d.path, d.line)))
            out += [f"- **{name}**: {value}" for name, value in fields] + [""]
    return "\n".join(out)


def detectron2_keys_page(_: str) -> str:
    """Detectron2's keys that largedet checks before launch or maps from a LazyConfig
    (:data:`largedet.config.keys.DETECTRON2_KEYS`), as a MyST table."""
    from largedet.config.keys import DETECTRON2_KEYS

    out = ["| Key | Allowed | LazyConfig |", "| --- | --- | --- |"]
    for key, rule, lazy in DETECTRON2_KEYS:
        allowed = _md(rule.need) if rule else ""
        out.append(f"| `{key}` | {allowed} | {_code('train.' + lazy) if lazy else ''} |")
    return "\n".join(out) + "\n"


def _rst_roles_to_myst(text: str) -> str:
    """A docstring's reStructuredText inline markup in MyST: ``:class:`X``` -> ``{py:class}`X```,
    double backquotes -> single."""
    text = re.sub(r":(class|func|meth|mod|data|attr|exc):`", r"{py:\1}`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def optimizer_registry_page(_: str) -> str:
    from largedet.solver import OPTIMIZER_REGISTRY

    out = ["| `SOLVER.OPTIMIZER` | Builder |", "| --- | --- |"]
    for name, builder in OPTIMIZER_REGISTRY:
        summary = _rst_roles_to_myst(inspect.getdoc(builder).split("\n\n")[0].replace("\n", " "))
        out.append(f"| `{name}` | {{py:func}}`{builder.__module__}.{builder.__name__}`: {summary} |")
    return "\n".join(out) + "\n"


def table_page(argument: str, _: Dict[str, str]) -> str:
    """The tuple of dataclass rows at an import path as a MyST table, a column per field."""
    rows = getattr(importlib.import_module(argument.rsplit(".", 1)[0]), argument.rsplit(".", 1)[1])
    fields = [f.name for f in dataclasses.fields(rows[0])]
    lines = [[f.replace("_", " ").capitalize() for f in fields], ["---"] * len(fields)]
    lines += [[str(getattr(row, f)).replace("|", "\\|") for f in fields] for row in rows]
    return "".join("| " + " | ".join(cells) + " |\n" for cells in lines)


# --- API sections -----------------------------------------------------------------------


def _public(module) -> List[str]:
    return list(getattr(module, "__all__", []))


def _defining_module(package, name: str) -> Optional[str]:
    """The submodule of ``package`` whose source assigns ``name`` (for data, which has no
    ``__module__``)."""
    from sphinx.pycode import ModuleAnalyzer

    candidates = [package.__name__]
    if hasattr(package, "__path__"):
        candidates += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    for modname in candidates:
        try:
            analyzer = ModuleAnalyzer.for_module(modname)
            analyzer.analyze()
        except Exception:  # noqa: BLE001  (a module without source: not this one)
            continue
        if ("", name) in analyzer.attr_docs:
            return modname
    return None


def _autodoc(modname: str, names: List[str], package) -> List[str]:
    """eval-rst lines documenting ``modname.<name>`` for each name."""
    lines = []
    for name in names:
        obj = getattr(importlib.import_module(modname), name)
        full = f"{modname}.{name}"
        if inspect.isclass(obj):
            kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
            lines += [f".. {kind}:: {full}", "   :members:"]
            lines += ["   :show-inheritance:", ""] if obj.__bases__ != (object,) else [""]
        elif callable(obj) and not hasattr(obj, "_obj_map"):
            lines += [f".. autofunction:: {full}", ""]
        else:
            lines += _data(full, obj, _defining_module(package, name))
    return lines


def _data(full: str, obj, defined_in: Optional[str]) -> List[str]:
    from sphinx.pycode import ModuleAnalyzer

    doc = []
    if defined_in:
        analyzer = ModuleAnalyzer.for_module(defined_in)
        doc = list(analyzer.find_attr_docs().get(("", full.rsplit(".", 1)[1]), []))
    if not doc and obj.__doc__ and obj.__doc__ != type(obj).__doc__:  # a docstring set on the object
        doc = inspect.cleandoc(obj.__doc__).splitlines()
    simple = isinstance(obj, (str, int, float, bool)) or (
        isinstance(obj, (tuple, frozenset)) and all(isinstance(v, (str, int, float)) for v in obj)
    )
    lines = [f".. py:data:: {full.rsplit('.', 1)[1]}"]  # in the module automodule set
    if simple and len(repr(obj)) <= 120:
        lines.append(f"   :value: {repr(obj)}")
    lines.append("")
    lines += [f"   {line}" if line else "" for line in doc] + [""]
    return lines


def api_page(argument: str, options: Dict[str, str]) -> str:
    package = importlib.import_module(argument)
    excluded = {f"{argument}.{m}" for m in options.get("exclude-modules", "").split()}

    def kept(modname, name) -> bool:
        obj = getattr(importlib.import_module(modname), name)
        return getattr(obj, "__module__", None) not in excluded

    names = [n for n in _public(package) if kept(argument, n)]
    out = ["```{eval-rst}", f".. automodule:: {argument}", ""] + _autodoc(argument, names, package) + ["```", ""]
    for sub in options.get("submodules", "").split():
        modname = f"{argument}.{sub}"
        module = importlib.import_module(modname)
        extra = [n for n in _public(module) if n not in _public(package) and kept(modname, n)]
        out += [f"### `{modname}`", "", "```{eval-rst}", f".. automodule:: {modname}", ""]
        out += _autodoc(modname, extra, module) + ["```", ""]
    return "\n".join(out)


GENERATORS = {
    "largedet-api": api_page,
    "largedet-config-keys": lambda argument, options: config_keys_page(argument),
    "largedet-optimizer-registry": lambda argument, options: optimizer_registry_page(argument),
    "largedet-detectron2-keys": lambda argument, options: detectron2_keys_page(argument),
    "largedet-table": table_page,
}


def _options(text: str) -> Dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^:([\w-]+):(.*)$", text, re.M)}


def generate(app, docname: str, source: List[str]) -> None:
    """``source-read``: each placeholder block replaced by its generated text."""

    def replace(match) -> str:
        name, argument, options = match.group(1), match.group(2).strip(), _options(match.group(3))
        if name not in GENERATORS:
            raise ValueError(f"{docname}: no generator {name!r}")
        return GENERATORS[name](argument, options)

    source[0] = PLACEHOLDER.sub(replace, source[0])


# --- links to repository files ----------------------------------------------------------


class RepositoryLinks(SphinxTransform):
    """Links to repository paths that are not pages (``download_reference``, or MyST's
    unresolved ``pending_xref``, or ``source:<path>``) become links to the path (see the
    module docstring). A target that is not in the repository stays, and Sphinx warns."""

    default_priority = 5  # before Sphinx's own reference transforms and collectors

    def apply(self) -> None:
        for node in list(self.document.findall(nodes.Element)):
            myst = isinstance(node, addnodes.pending_xref) and node.get("reftype") == "myst"
            if myst and node.get("refdomain") == "doc" and node["reftarget"] not in self.env.found_docs:
                self._rewrite(node, self.env.doc2path(node["reftarget"]), node.get("reftargetid") or "")
            elif isinstance(node, addnodes.download_reference) or (myst and not node.get("refdomain")):
                self._rewrite(node)
            elif isinstance(node, nodes.reference) and node.get("refuri", "").startswith("source:"):
                self._rewrite(node)

    def _rewrite(self, node, resolved: str = "", anchor: str = "") -> None:
        target = node.get("reftarget") or node.get("refuri", "")
        if resolved:
            resolved = os.path.normpath(resolved)
        elif target.startswith("source:"):
            path, _, anchor = target[len("source:"):].partition("#")
            resolved = os.path.join(ROOT, path)
        else:
            file, _, anchor = target.partition("#")
            source = node.source or self.env.doc2path(self.env.docname)
            resolved = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(source)), file))
        inside = os.path.commonpath([resolved, ROOT]) == ROOT
        if not inside or not os.path.exists(resolved) or self.env.path2doc(resolved) in self.env.found_docs:
            return
        rel = os.path.relpath(resolved, ROOT).replace(os.sep, "/")
        base = self.config.largedet_source_url
        if base:
            uri = f"{base.rstrip('/')}/{rel}"
        else:
            page_dir = os.path.dirname(os.path.join(self.app.outdir, self.env.docname))
            uri = os.path.relpath(os.path.join(ROOT, rel), page_dir).replace(os.sep, "/")
            anchor = ""  # a raw file read from disk has no anchors
        link = nodes.reference("", "", *node.children, refuri=uri + (f"#{anchor}" if anchor else ""),
                               internal=False, classes=["repository-file"])  # fmt: skip
        node.replace_self(link)


_ORIGINAL_DOCSTRINGS: Dict[str, List[str]] = {}


def _before_napoleon(app, what, name, obj, options, lines: List[str]) -> None:
    """``autodoc-process-docstring``, before napoleon: keep a property's or attribute's lines.
    Napoleon reads such a docstring's first line as ``type: description``, and this project's
    first lines read "Images the run trains on: ``MAX_ITER x IMS_PER_BATCH``"."""
    if what in ("attribute", "property") and lines and ":" in lines[0]:
        _ORIGINAL_DOCSTRINGS[name] = list(lines)


def _after_napoleon(app, what, name, obj, options, lines: List[str]) -> None:
    """``autodoc-process-docstring``, after napoleon: the kept lines back (the type is the
    annotation's, shown in the signature)."""
    if name in _ORIGINAL_DOCSTRINGS:
        lines[:] = _ORIGINAL_DOCSTRINGS.pop(name)


def setup(app):
    app.add_config_value("largedet_source_url", os.environ.get("LARGEDET_SOURCE_URL", ""), "env")
    app.add_object_type("confkey", "confkey", objname="config key", indextemplate="pair: %s; config key")
    app.connect("source-read", generate)
    app.connect("autodoc-process-docstring", _before_napoleon, priority=100)
    app.connect("autodoc-process-docstring", _after_napoleon, priority=900)
    app.add_transform(RepositoryLinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


