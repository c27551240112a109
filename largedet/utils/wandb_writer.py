"""Weights & Biases as a Detectron2 event writer, beside ``metrics.json`` and TensorBoard.

:class:`WandbWriter` logs what Detectron2's ``JSONWriter`` writes to
``metrics.json``: every scalar of the event storage (losses, ``lr``, ``time``,
``data_time``, evaluation results, ``agvm/...``), median-smoothed over the last
``window_size`` values where the scalar asks for it, with the iteration as W&B's
step. It runs where the other writers run (Detectron2's ``PeriodicWriter``, every
``LOG_PERIOD`` steps, on the main process only). ``wandb`` is imported only when a
writer is built, so it stays an optional dependency.

Switched on by ``WANDB.ENABLED`` (see :func:`largedet.config.add_largedet_config`)::

    def build_writers(self):
        return default_writers(self.cfg.OUTPUT_DIR, self.max_iter) + build_wandb_writers(self.cfg)
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from typing import Dict, List, Optional

import yaml
from detectron2.utils.events import EventWriter, get_event_storage

__all__ = ["WandbWriter", "build_wandb_writers"]

logger = logging.getLogger(__name__)


class WandbWriter(EventWriter):
    """Logs the event storage's latest scalars to one W&B run."""

    def __init__(
        self,
        *,
        project: str,
        name: str = "",
        entity: str = "",
        mode: str = "",
        log_dir: str = "",
        config: Optional[Dict] = None,
        window_size: int = 20,
    ):
        """
        Args:
            project: W&B project.
            name: run name ("": W&B picks one).
            entity: W&B team or user ("": the account's default).
            mode: ``wandb.init``'s mode, "online", "offline" or "disabled"; "" leaves
                it to wandb ($WANDB_MODE, else online).
            log_dir: folder under which wandb writes the run's files (its ``wandb/``
                folder); "": wandb's default ($WANDB_DIR, else the working directory).
            config: the run's configuration, as plain nested dicts (shown in W&B).
            window_size: median-smoothing window of scalars with a smoothing hint,
                as for ``metrics.json``.
        """
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "WANDB.ENABLED is true but the wandb package is not installed: "
                "pip install wandb, or set WANDB.ENABLED False"
            ) from e
        kwargs = {"project": project, "config": config or {}}
        for key, value in (("name", name), ("entity", entity), ("mode", mode), ("dir", log_dir)):
            if value:
                kwargs[key] = value
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self._run = wandb.init(**kwargs)
        self._window_size = window_size
        self._last_write = -1
        logger.info(
            "Logging to W&B: project %s, run %s, mode %s, files in %s",
            project,
            self._run.name,
            self._run.settings.mode,
            self._run.dir,
        )

    @property
    def run(self):
        """The ``wandb`` run this writer logs to."""
        return self._run

    def write(self):
        storage = get_event_storage()
        by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
        for key, (value, iteration) in storage.latest_with_smoothing_hint(
            self._window_size
        ).items():
            if iteration > self._last_write:
                by_iter[iteration][key] = value
        # W&B's step must grow: log the iterations in order, each one once.
        for iteration in sorted(by_iter):
            self._run.log(by_iter[iteration], step=iteration)
            self._last_write = iteration

    def close(self):
        self._run.finish()


def build_wandb_writers(cfg) -> List[EventWriter]:
    """``[WandbWriter]`` set up from ``cfg.WANDB`` (the whole config logged as the run's
    config, its files under ``OUTPUT_DIR``), or ``[]`` when ``WANDB.ENABLED`` is false."""
    c = cfg.WANDB
    if not c.ENABLED:
        return []
    return [
        WandbWriter(
            project=c.PROJECT,
            name=c.NAME or os.path.basename(os.path.normpath(cfg.OUTPUT_DIR)),
            entity=c.ENTITY,
            mode=c.MODE,
            log_dir=cfg.OUTPUT_DIR,
            config=yaml.safe_load(cfg.dump()),
        )
    ]
