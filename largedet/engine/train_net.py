"""The detection training script as a module: ``python -m largedet.engine.train_net`` is
``python tools/train_net.py`` (same arguments), for programs that start runs without
knowing where the checkout is (the study runner)."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from ..launch.job import check_and_launch
from .defaults import (
    check_args,
    config_output_dir,
    config_timeout_s,
    largedet_argument_parser,
    print_box_ap,
    setup_cfg,
    train_or_evaluate,
)
from .trainer import Trainer

__all__ = ["main", "run"]


def main(args: argparse.Namespace) -> dict:
    """One process's work: build the config, train (or evaluate) a :class:`Trainer`, print
    ``box AP: ...``."""
    cfg = setup_cfg(args)
    results = train_or_evaluate(Trainer, cfg, args)
    print_box_ap(results)
    return results


def run(argv: Optional[Sequence[str]] = None) -> None:
    """Parse ``argv`` (default: the command line), check the config, start the processes."""
    args = largedet_argument_parser().parse_args(argv)
    check_and_launch(main, args, check_args, output_dir=config_output_dir, timeout_s=config_timeout_s)


if __name__ == "__main__":
    run()
