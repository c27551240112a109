"""A user's own modules, imported by the training scripts before the config is checked and
in every process of the job: ``--import MODULE`` (repeatable) and the config key
``IMPORTS`` (``train.imports`` of a LazyConfig).

Such a module registers what a run names: an optimizer (``OPTIMIZER_REGISTRY``), a
dataset (Detectron2's ``DatasetCatalog`` and ``MetadataCatalog``), an evaluator
(``EVALUATOR_REGISTRY``, by the dataset's ``evaluator_type``), a model part (Detectron2's
model registries), a hook (``HOOK_REGISTRY``). Each process imports it as it builds its
config (:func:`import_modules`, called by every script's set-up): the one that checks the
config before launch, each worker that Detectron2's ``launch`` spawns, each process that
torchrun or Slurm starts, on every machine. Modules are found on ``sys.path`` and in the
working directory, as ``python -m`` finds them. A module that cannot be imported is one
:class:`~largedet.config.errors.ConfigError` line naming it and where its import failed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from collections.abc import Iterable, Sequence

from .errors import ConfigError

__all__ = ["IMPORT_FLAG", "add_import_argument", "import_modules", "import_run_modules", "imports_of"]

#: the command-line flag
IMPORT_FLAG = "--import"

_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def add_import_argument(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--import MODULE`` (repeatable; ``args.imports``) to a script's ``parser``."""
    parser.add_argument(
        IMPORT_FLAG,
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a Python module to import before the config is checked, in every process "
        "(one that registers an optimizer, a dataset, an evaluator, a model or a hook); "
        "repeat for more; looked up on sys.path and in the working directory; the config "
        "key IMPORTS lists more",
    )
    return parser


def imports_of(configured: Iterable[str], args: argparse.Namespace) -> tuple:
    """The modules of a run: the config's (``IMPORTS``, ``configured``), then those of
    ``--import`` (``args.imports``; none for a namespace without it) that it does not list."""
    configured = tuple(configured)
    return configured + tuple(
        dict.fromkeys(n for n in getattr(args, "imports", None) or () if n not in configured)
    )


def import_run_modules(configured: Sequence[str], args: argparse.Namespace, key: str = "IMPORTS") -> tuple:
    """Import the modules of a run (:func:`imports_of`: the config key ``key``'s,
    ``configured``, and ``--import``'s) and return them, for the config to record."""
    configured = tuple(configured)
    modules = imports_of(configured, args)
    import_modules(modules[len(configured):], IMPORT_FLAG)
    import_modules(configured, key)
    return modules


def import_modules(names: Sequence[str], source: str = IMPORT_FLAG) -> None:
    """Import each module of ``names`` (given by ``source``: ``--import``, ``IMPORTS`` or
    ``train.imports``, named in the error), the working directory searched after
    ``sys.path``. A module imported before is not imported again. Raises
    :class:`~largedet.config.errors.ConfigError`, one line, for a name that is not a module
    name and for a module whose import fails (its own error and where it was raised)."""
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.match(name):
            raise ConfigError(f"{source}: {name!r} is not a module name (such as my_ext or my.ext)")
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the user's module: any error of its import is this one line
            raise ConfigError(f"{source} {name}: {_where(e, name)}") from None


def _where(error: Exception, name: str) -> str:
    """``error`` of importing the module ``name`` in one line, with the file and line where
    it was raised (the module's own code), or, where the module (or its package) was not
    found, what was searched."""
    what = " ".join(f"{type(error).__name__}: {error}".split())
    if isinstance(error, ModuleNotFoundError) and f"{name}.".startswith(f"{error.name}."):
        hint = "; a module's name has no .py" if name.endswith(".py") else ""
        return f"{what} (searched: sys.path and the working directory {os.getcwd()}){hint}"
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename]
    if isinstance(error, SyntaxError) or not own:
        return what
    return f"{what} ({own[-1].filename}:{own[-1].lineno})"
