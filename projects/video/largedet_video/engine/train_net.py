"""The video training script as a module: ``projects/video/train.py``, the console command
``largedet-video-train`` and ``python -m largedet_video.engine.train_net`` are the same program
(same arguments; without ``--config-file`` the built-in demo,
:data:`~largedet_video.engine.defaults.DEFAULT_CONFIG`)."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from detectron2.utils import comm
from largedet.engine import check_and_launch, largedet_argument_parser, train_or_evaluate

from .defaults import setup
from .trainer import VideoTrainer
from .checks import check_video_args, video_output_dir, video_timeout_s

__all__ = ["main", "run"]


def main(args: argparse.Namespace) -> dict:
    """One process's work: build the config, train (or evaluate) a :class:`VideoTrainer`,
    print each test set's ``top-1``."""
    cfg = setup(args)
    results = train_or_evaluate(VideoTrainer, cfg, args)
    if comm.is_main_process():
        per_dataset = {cfg.DATASETS.TEST[0]: results} if "classification" in results else results
        for name, res in per_dataset.items():
            if "classification" in res:
                print(f"{name}: top-1 {res['classification']['top1']:.1f}%")
    return results


def run(argv: Optional[Sequence[str]] = None) -> None:
    """Parse ``argv`` (default: the command line), check the config, start the processes."""
    args = largedet_argument_parser().parse_args(argv)
    check_and_launch(main, args, check_video_args, output_dir=video_output_dir, timeout_s=video_timeout_s)


if __name__ == "__main__":
    run()
