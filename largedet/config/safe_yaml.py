"""Config files that cannot run code.

Detectron2 reads a yaml config with ``yaml.safe_load`` and, where that fails on a tag it
does not know, again with ``yaml.unsafe_load``, which builds whatever a ``!!python/...``
tag names: ``!!python/object/apply:os.system ["..."]`` runs a command while the config
loads. :func:`check_config_tags` reads a config file and its ``_BASE_`` files (resolved as
Detectron2 resolves them) with the safe loader's parser, without building anything, and
refuses a tag that the safe loader does not build, naming the file, the tag and its line;
the file then never reaches Detectron2's fallback. :func:`merge_config_file` is the one way
largedet's scripts read a yacs config file: the check, then Detectron2's ``merge_from_file``
with its ``yaml.unsafe_load`` fallback switched off, so that a tag the check could not see (in
a remote ``_BASE_``, or a file changed in between) fails to load rather than runs.
``allow_python_tags`` (the scripts' ``--allow-python-yaml``) lets such a file load, with a
warning.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional, Set

import yaml
from fvcore.common.config import CfgNode

from .errors import ConfigError

__all__ = ["PythonTagError", "check_config_tags", "merge_config_file"]

logger = logging.getLogger(__name__)

_BASE_KEY = "_BASE_"
_YAML_TAG_PREFIX = "tag:yaml.org,2002:"


class PythonTagError(ConfigError):
    """A config file holds a tag that the safe yaml loader does not build (one line)."""


def _short(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG_PREFIX):] if tag.startswith(_YAML_TAG_PREFIX) else tag


def _safe_tag(tag: str) -> bool:
    constructors = yaml.SafeLoader.yaml_constructors
    return tag in constructors or any(
        tag.startswith(prefix) for prefix in yaml.SafeLoader.yaml_multi_constructors
    )


def _unsafe_tags(node) -> List[str]:
    """``"!!tag (line N)"`` for each node under ``node`` whose tag the safe loader does not build."""
    found, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:  # aliases
            continue
        seen.add(id(n))
        if not _safe_tag(n.tag):
            found.append((n.start_mark.line, n.start_mark.column, _short(n.tag)))
        if isinstance(n, yaml.MappingNode):
            stack.extend(x for pair in n.value for x in pair)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return [f"{tag} (line {line + 1})" for line, _, tag in sorted(found)]


def _base_files(path: str, node) -> List[str]:
    """The ``_BASE_`` files named by the top mapping ``node`` of the config ``path``, as
    Detectron2 resolves them."""
    bases: List[str] = []
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == _BASE_KEY:
                values = value.value if isinstance(value, yaml.SequenceNode) else [value]
                bases += [v.value for v in values if isinstance(v, yaml.ScalarNode)]
    out = []
    for base in bases:
        if base.startswith("~"):
            base = os.path.expanduser(base)
        if not base.startswith(("/", "https://", "http://")):
            base = os.path.join(os.path.dirname(path), base)
        out.append(base)
    return out


def check_config_tags(path: Optional[str], allow_python_tags: bool = False) -> List[str]:
    """Check the yaml config ``path`` and its ``_BASE_`` files for tags the safe loader does
    not build (``!!python/object/apply:...``, ``!!python/name:...``). Raises
    :class:`PythonTagError` (``<file>: refusing the tag !!python/... (line N): ...``) on the
    first such file; with ``allow_python_tags``, logs a warning for each and returns those
    lines. A file that is missing, not local or not valid yaml is left to the config merge,
    which names its own error."""
    allowed: List[str] = []
    pending, visited = [path] if path else [], set()  # type: List[str], Set[str]
    while pending:
        current = pending.pop()
        if current in visited or "://" in current or not os.path.isfile(current):
            continue
        visited.add(current)
        try:
            with open(current, encoding="utf-8") as f:
                node = yaml.compose(f, Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if node is None:
            continue
        tags = _unsafe_tags(node)
        if tags:
            if not allow_python_tags:
                more = f" and {len(tags) - 1} more" if len(tags) > 1 else ""
                raise PythonTagError(
                    f"{current}: refusing the tag {tags[0]}{more}: a config file is read with "
                    "the safe yaml loader, and this tag would build a Python object (it can run "
                    "code); remove it, or pass --allow-python-yaml if you trust the file"
                )
            line = (
                f"{current}: loading {', '.join(tags)} with yaml.unsafe_load "
                "(--allow-python-yaml): the file can run code"
            )
            logger.warning(line)
            allowed.append(line)
        pending.extend(_base_files(current, node))
    return allowed


def merge_config_file(cfg: CfgNode, path: str, allow_python_tags: bool = False) -> None:
    """Merge the yaml config ``path`` and its ``_BASE_`` files into ``cfg``: refuse a
    Python tag first (:func:`check_config_tags`; :class:`PythonTagError`), then
    ``cfg.merge_from_file`` with the safe loader alone, unless ``allow_python_tags``.
    Detectron2's own errors (a missing file, an unknown key, ...) pass through."""
    check_config_tags(path, allow_python_tags)
    cfg.merge_from_file(path, allow_unsafe=allow_python_tags)
