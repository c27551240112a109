"""An autouse fixture for both test trees (tests/ and projects/video/tests/): no test leaves
process-wide state behind for the tests that run after it in the same process.

``make test`` spreads the test files over two pytest-xdist workers, and a random order
(``pytest -p randomly``) puts any test after any other; a test whose outcome depends on what an
earlier one left (a handler, an environment variable, a registered name) fails in some orders
only. After each test, :func:`restore_global_state` puts back what it found before the test:

- loggers: each logger's handlers, level, ``propagate`` and ``disabled`` flag, and
  ``logging.disable``; a handler added during the test is closed, and one on a closed stream is
  removed (Detectron2's ``setup_logger`` is cached, so its cache is cleared: the next call sets
  the logger up anew);
- ``os.environ``, the working directory, the handlers of the signals a training run catches;
- torch's thread count, default dtype and grad mode;
- Detectron2's ``DatasetCatalog`` and ``MetadataCatalog`` and the entries of every fvcore
  ``Registry`` of detectron2, largedet and largedet_video. An entry made by importing a module
  for the first time during the test stays (the import is not undone, so neither is what it
  registered); every other one goes.

Higher-scoped fixtures (a session's dataset) are set up before this function-scoped one, so
what they register is part of the state kept."""

import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import pytest
import torch
from largedet.launch.loggers import all_loggers

SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGALRM", "SIGCHLD")
    if hasattr(signal, name)
)
REGISTRY_OWNERS = ("detectron2", "fvcore", "largedet", "largedet_video")


def handlers_on_closed_streams():
    """(logger, handler) of every handler whose stream is closed."""
    return [
        (logger, handler)
        for logger in all_loggers()
        for handler in list(logger.handlers)
        if getattr(getattr(handler, "stream", None), "closed", False)
    ]


def _registries():
    """Every fvcore ``Registry`` held by a module attribute of :data:`REGISTRY_OWNERS`."""
    from fvcore.common.registry import Registry

    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in REGISTRY_OWNERS:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Registry):
                found[id(value)] = value
    return list(found.values())


@dataclass
class Snapshot:
    """What :func:`restore_global_state` puts back."""

    loggers: Dict[str, Tuple[list, int, bool, bool]] = field(default_factory=dict)
    disable: int = logging.NOTSET
    environ: Dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    signals: Dict[int, object] = field(default_factory=dict)
    torch_state: Tuple = ()
    catalogs: Dict[str, dict] = field(default_factory=dict)
    registries: List[Tuple[object, dict]] = field(default_factory=list)
    modules: frozenset = frozenset()

    @classmethod
    def take(cls) -> "Snapshot":
        from detectron2.data import DatasetCatalog, MetadataCatalog

        return cls(
            loggers={lg.name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in all_loggers()},
            disable=logging.root.manager.disable,
            environ=dict(os.environ),
            cwd=os.getcwd(),
            signals={s: signal.getsignal(s) for s in SIGNALS},
            torch_state=(torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()),
            catalogs={"DatasetCatalog": dict(DatasetCatalog), "MetadataCatalog": dict(MetadataCatalog)},
            registries=[(r, dict(r._obj_map)) for r in _registries()],
            modules=frozenset(sys.modules),
        )

    def restore(self) -> List[str]:
        """Put the state back; returns what had changed, one phrase each."""
        changed = self._restore_loggers()
        if dict(os.environ) != self.environ:
            changed.append("os.environ")
            os.environ.clear()
            os.environ.update(self.environ)
        if os.getcwd() != self.cwd:
            changed.append("working directory")
            os.chdir(self.cwd)
        for sig, handler in self.signals.items():
            if handler is not None and signal.getsignal(sig) != handler:
                changed.append(f"handler of {signal.Signals(sig).name}")
                signal.signal(sig, handler)
        threads, dtype, grad = self.torch_state
        if (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()) != self.torch_state:
            changed.append("torch threads, default dtype or grad mode")
            torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
        return changed + self._restore_registries()

    def _restore_loggers(self) -> List[str]:
        changed = []
        for logger in all_loggers():
            handlers, level, propagate, disabled = self.loggers.get(logger.name, ([], logging.NOTSET, True, False))
            if (logger.handlers, logger.level, logger.propagate, logger.disabled) == (
                handlers, level, propagate, disabled
            ):
                continue
            changed.append(f"logger {logger.name or 'root'}")
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled
        for logger, handler in handlers_on_closed_streams():
            logger.removeHandler(handler)
            changed.append(f"logger {logger.name or 'root'} (closed stream)")
        if logging.root.manager.disable != self.disable:
            changed.append("logging.disable")
            logging.disable(self.disable)
        if changed:
            from detectron2.utils.logger import setup_logger

            setup_logger.cache_clear()
        return changed

    def _restore_registries(self) -> List[str]:
        from detectron2.data import DatasetCatalog, MetadataCatalog

        changed = []
        for name, catalog in (("DatasetCatalog", DatasetCatalog), ("MetadataCatalog", MetadataCatalog)):
            kept = self.catalogs[name]
            if set(catalog) != set(kept):
                changed.append(name)
                catalog.clear()
                catalog.update(kept)
        before = {id(r): entries for r, entries in self.registries}
        for registry in _registries():
            kept = before.get(id(registry), {})
            imported = {
                key: obj for key, obj in registry._obj_map.items()
                if key not in kept and getattr(obj, "__module__", None) not in self.modules
            }  # fmt: skip
            wanted = {**kept, **imported}
            if registry._obj_map.keys() != wanted.keys() or any(registry._obj_map[k] is not v for k, v in wanted.items()):
                changed.append(f"registry {registry._name}")
                registry._obj_map.clear()
                registry._obj_map.update(wanted)
        return changed


@pytest.fixture(autouse=True)
def restore_global_state():
    snapshot = Snapshot.take()
    yield
    snapshot.restore()
