"""Training: the trainer, the command line and set-up."""

from .defaults import largedet_argument_parser, resolve_device, setup_cfg
from .trainer import Trainer

__all__ = ["Trainer", "largedet_argument_parser", "resolve_device", "setup_cfg"]
