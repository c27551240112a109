"""Config files that cannot run code, read once.

Detectron2 reads a yaml config with ``yaml.safe_load`` and, where that fails on a tag it
does not know, again with ``yaml.unsafe_load``, which builds whatever a ``!!python/...``
tag names: ``!!python/object/apply:os.system ["..."]`` runs a command while the config
loads. Its ``LazyConfig.load`` reads a yaml LazyConfig with ``yaml.unsafe_load`` alone.

Here every config file is read by :func:`read_config_text`: opened once (without waiting on
a FIFO), refused unless it is a regular file, read as bytes and decoded as UTF-8, each
refusal a one-line :class:`~largedet.config.errors.ConfigError` naming the file. The tags
are checked on that text (:func:`check_text_tags`: a tag the safe loader does not build is
refused, naming the file, the tag and its line) and that same text is parsed with the safe
loader; nothing reads the path a second time, so a file changed or swapped in between is
never what loads. :func:`load_yacs_config` reads a yacs config and its ``_BASE_`` files
(resolved and merged as Detectron2 resolves and merges them), :func:`merge_config_file`
merges one into a config (Detectron2's ``merge_from_file`` on the checked text, its old
config versions upgraded as it upgrades them), :func:`load_yaml_lazy_config` reads a yaml
LazyConfig. ``allow_python_tags`` (the scripts' ``--allow-python-yaml``) parses a file
holding such tags with ``yaml.unsafe_load``, with a warning.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any, Dict, List, Optional

import yaml
from detectron2.config.compat import downgrade_config, guess_version, upgrade_config
from detectron2.utils.file_io import PathManager
from fvcore.common.config import CfgNode
from omegaconf import OmegaConf

from .errors import ConfigError

__all__ = [
    "PythonTagError",
    "check_config_tags",
    "check_text_tags",
    "load_yacs_config",
    "load_yaml_lazy_config",
    "merge_config_file",
    "read_config_text",
]

logger = logging.getLogger(__name__)

_BASE_KEY = "_BASE_"
_YAML_TAG_PREFIX = "tag:yaml.org,2002:"


class PythonTagError(ConfigError):
    """A config file holds a tag that the safe yaml loader does not build (one line)."""


def read_config_text(path: str) -> str:
    """The text of the config file ``path``: opened once, without blocking (a FIFO is not
    waited on), checked to be a regular file on the open descriptor, read whole and decoded
    as UTF-8. Raises :class:`ConfigError`, one line naming the file: not found, not a
    regular file (a folder, a FIFO, a device), unreadable, or not UTF-8 text."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
            raise ConfigError(f"{path}: is {what}, not a regular file: a config is read from a file")
        try:
            data = f.read()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x}): a config file is "
            "read as UTF-8, whatever the locale; save it as UTF-8"
        ) from None


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


def _not_yaml(path: str, error: yaml.YAMLError) -> ConfigError:
    return ConfigError(f"{path}: not valid YAML: {' '.join(str(error).split())}")


def check_text_tags(path: str, text: str, allow_python_tags: bool = False) -> List[str]:
    """Check the yaml ``text`` of the file ``path`` for tags the safe loader does not build
    (``!!python/object/apply:...``, ``!!python/name:...``). Raises :class:`PythonTagError`
    (``<file>: refusing the tag !!python/... (line N): ...``), or :class:`ConfigError` where
    the text is not yaml; with ``allow_python_tags``, logs a warning for the tags found and
    returns that line (``[]`` when there are none)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise _not_yaml(path, e) from None
    tags = _unsafe_tags(node) if node is not None else []
    if not tags:
        return []
    if not allow_python_tags:
        more = f" and {len(tags) - 1} more" if len(tags) > 1 else ""
        raise PythonTagError(
            f"{path}: refusing the tag {tags[0]}{more}: a config file is read with "
            "the safe yaml loader, and this tag would build a Python object (it can run "
            "code); remove it, or pass --allow-python-yaml if you trust the file"
        )
    line = (
        f"{path}: loading {', '.join(tags)} with yaml.unsafe_load "
        "(--allow-python-yaml): the file can run code"
    )
    logger.warning(line)
    return [line]


def _parse(path: str, text: str, allow_python_tags: bool, warnings: Optional[List[str]] = None) -> Any:
    """``text`` (of the file ``path``) checked (:func:`check_text_tags`), then parsed: with
    the safe loader, or with ``yaml.unsafe_load`` where allowed tags were found."""
    found = check_text_tags(path, text, allow_python_tags)
    if warnings is not None:
        warnings += found
    try:
        return yaml.unsafe_load(text) if found else yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _not_yaml(path, e) from None


def _base_path(path: str, base: str) -> str:
    """A ``_BASE_`` entry of the config ``path``, as Detectron2 resolves it."""
    if base.startswith("~"):
        base = os.path.expanduser(base)
    if not base.startswith(("/", "https://", "http://")):
        base = os.path.join(os.path.dirname(path), base)
    return base


def _local(path: str) -> str:
    """``path``, or the local copy of a ``_BASE_`` at a URL (fetched by Detectron2's
    ``PathManager``)."""
    if "://" not in path:
        return path
    try:
        return PathManager.get_local_path(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot fetch the config file: {e}") from None


def _merge_a_into_b(a: Dict, b: Dict, path: str) -> None:
    for key, value in a.items():
        if isinstance(value, dict) and key in b:
            if not isinstance(b[key], dict):
                raise ConfigError(f"{path}: cannot inherit the key {key!r} from a _BASE_ file")
            _merge_a_into_b(value, b[key], path)
        else:
            b[key] = value


def load_yacs_config(
    path: str, allow_python_tags: bool = False, warnings: Optional[List[str]] = None
) -> Dict[str, Any]:
    """The yacs config file ``path`` with its ``_BASE_`` files merged under it, as
    Detectron2's ``load_yaml_with_base`` merges them, each file read once
    (:func:`read_config_text`) and parsed with the safe loader after its tags are checked.
    Raises :class:`ConfigError` naming ``path`` (a file that cannot be read, parsed or
    merged; a ``_BASE_`` cycle), or :class:`PythonTagError` naming the file that holds the
    tag; the lines of allowed tags are appended to ``warnings``."""
    try:
        return _load_with_base(path, allow_python_tags, warnings, ())
    except PythonTagError:
        raise
    except ConfigError as e:  # in a _BASE_ file: named after the file given
        if str(e).startswith(f"{path}: "):
            raise
        raise ConfigError(f"{path}: cannot read {e}") from None


def _load_with_base(path: str, allow_python_tags: bool, warnings: Optional[List[str]],
                    chain: tuple) -> Dict[str, Any]:  # fmt: skip
    if path in chain:
        raise ConfigError(f"{chain[0]}: its _BASE_ files form a cycle ({path} again)")
    loaded = _parse(path, read_config_text(_local(path)), allow_python_tags, warnings)
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: not a mapping of config keys")
    if _BASE_KEY not in loaded:
        return loaded
    bases = loaded.pop(_BASE_KEY)
    merged: Dict[str, Any] = {}
    for base in bases if isinstance(bases, list) else [bases]:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: _BASE_ must name files, got {base!r}")
        base_path = _base_path(path, base)
        base_cfg = _load_with_base(base_path, allow_python_tags, warnings, (*chain, path))
        _merge_a_into_b(base_cfg, merged, base_path)
    _merge_a_into_b(loaded, merged, path)
    return merged


def merge_loaded_config(cfg: CfgNode, loaded: Dict[str, Any], path: str) -> None:
    """Merge ``loaded`` (:func:`load_yacs_config` of ``path``) into Detectron2's ``cfg`` as its
    ``merge_from_file`` merges a file: a config of an older ``VERSION`` is upgraded with
    Detectron2's own conversions. yacs's errors (an unknown key, a wrong type) pass through."""
    loaded_cfg = type(cfg)(loaded)
    version = loaded_cfg.get("VERSION", None)
    if version is None:
        version = guess_version(loaded_cfg, path)
    if version > cfg.VERSION:
        raise ConfigError(f"{path}: VERSION {version} is newer than Detectron2's {cfg.VERSION}")
    if version == cfg.VERSION:
        cfg.merge_from_other_cfg(loaded_cfg)
        return
    logger.warning("%s: a v%s config, upgraded to v%s as Detectron2 upgrades it", path, version, cfg.VERSION)
    old = downgrade_config(cfg, to_version=version)
    old.merge_from_other_cfg(loaded_cfg)
    upgraded = upgrade_config(old)
    cfg.clear()
    cfg.update(upgraded)


def merge_config_file(cfg: CfgNode, path: str, allow_python_tags: bool = False) -> Dict[str, Any]:
    """Merge the yacs config file ``path`` and its ``_BASE_`` files into ``cfg``
    (:func:`load_yacs_config`, then :func:`merge_loaded_config`) and return what was read.
    Raises :class:`ConfigError` for a file that cannot be read or parsed or holds a Python
    tag (unless ``allow_python_tags``); yacs's own errors pass through."""
    loaded = load_yacs_config(path, allow_python_tags)
    merge_loaded_config(cfg, loaded, path)
    return loaded


def load_yaml_lazy_config(path: str, allow_python_tags: bool = False):
    """A yaml LazyConfig (what Detectron2's ``LazyConfig.save`` writes), read once and parsed
    with the safe loader after its tags are checked, as the ``DictConfig`` that
    ``LazyConfig.load`` returns for it. Raises :class:`ConfigError` naming the file. The
    ``_BASE_`` files it names (Detectron2 merges none into a LazyConfig) are checked as a
    yacs config's are (:func:`check_config_tags`)."""
    loaded = _parse(path, read_config_text(path), allow_python_tags)
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: not a mapping of config keys")
    for base in _bases(path, loaded):
        check_config_tags(base, allow_python_tags)
    return OmegaConf.create(loaded, flags={"allow_objects": True})


def check_config_tags(path: Optional[str], allow_python_tags: bool = False) -> List[str]:
    """Read the yaml config ``path`` and its ``_BASE_`` files (each once,
    :func:`read_config_text`) and check their tags (:func:`check_text_tags`), without merging
    anything: a check before a job is submitted. Raises :class:`ConfigError` naming the
    file; with ``allow_python_tags`` returns the warning lines."""
    if not path:
        return []
    warnings: List[str] = []
    pending: List[str] = [path]
    visited = set()
    while pending:
        current = pending.pop()
        if current in visited or "://" in current:
            continue
        visited.add(current)
        loaded = _parse(current, read_config_text(current), allow_python_tags, warnings)
        pending += _bases(current, loaded)
    return warnings


def _bases(path: str, loaded: Any) -> List[str]:
    """The ``_BASE_`` files that the parsed config ``loaded`` of ``path`` names, resolved."""
    bases = loaded.get(_BASE_KEY, []) if isinstance(loaded, dict) else []
    return [_base_path(path, b) for b in (bases if isinstance(bases, list) else [bases]) if isinstance(b, str)]
