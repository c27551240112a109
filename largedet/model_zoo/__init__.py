"""The configs that come with largedet, by name, wherever largedet is installed.

A name is a path under the checkout's ``configs/`` (``"shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml"``,
``"r50_fpn_bs1056.yaml"``) or, prefixed with ``video/``, under ``projects/video/configs/``
(``"video/tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml"``); the checkout-relative paths that the
docs show (``"configs/shapes/..."``, ``"projects/video/configs/..."``) name the same files.

In a wheel the configs are package data, ``largedet/model_zoo/configs/`` (``setup.py``'s
``build_py`` copies both folders there, the video ones under ``video/``); in a checkout or an
editable install they are the checkout's own files. :func:`get_config_file` returns the file's
path, as ``detectron2.model_zoo.get_config_file`` does for Detectron2's configs;
:func:`resolve_config_file` is what the training scripts do with ``--config``: a path that
exists is used as it is, a name is looked up.
"""

from __future__ import annotations

import os

__all__ = ["PACKAGED_CONFIGS", "config_roots", "get_config_file", "resolve_config_file"]

#: Where a wheel holds the configs (absent in a checkout)
PACKAGED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHECKOUT_PREFIXES = (("projects/video/configs/", "video/"), ("configs/", ""))


def config_roots() -> dict[str, str]:
    """``{"": detection configs folder, "video/": video configs folder}``: the wheel's package
    data where it is installed, else the checkout's folders."""
    if os.path.isdir(PACKAGED_CONFIGS):
        return {"": PACKAGED_CONFIGS, "video/": os.path.join(PACKAGED_CONFIGS, "video")}
    return {
        "": os.path.join(_CHECKOUT, "configs"),
        "video/": os.path.join(_CHECKOUT, "projects", "video", "configs"),
    }


def _normalized(name: str) -> str:
    name = name.replace(os.sep, "/")
    if name.startswith("./"):
        name = name[2:]
    for prefix, replacement in _CHECKOUT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return name


def _lookup(name: str) -> str | None:
    name = _normalized(name)
    roots = config_roots()
    if name.startswith("video/"):
        path = os.path.join(roots["video/"], name[len("video/"):])
    else:
        path = os.path.join(roots[""], name)
    return path if os.path.isfile(path) else None


def get_config_file(name: str) -> str:
    """The path of largedet's config ``name`` (see the module docstring), e.g.
    ``get_config_file("shapes/faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml")``. Raises
    ``FileNotFoundError`` naming the folders searched."""
    path = _lookup(name)
    if path is None:
        roots = config_roots()
        raise FileNotFoundError(
            f"{name}: no such largedet config (searched {roots['']} and {roots['video/']})"
        )
    return path


def resolve_config_file(path: str | None) -> str | None:
    """``--config``'s value as the scripts read it: ``path`` where such a file exists (or
    ``path`` is empty), else largedet's config of that name where there is one, else ``path``
    unchanged (so that the missing file is reported as given)."""
    if not path or os.path.exists(path):
        return path
    return _lookup(path) or path
