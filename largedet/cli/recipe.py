"""``largedet-recipe`` (the wheel's command) and ``tools/recipe.py``: the large-batch
detection recipe (:mod:`largedet.solver.recipe`) as the keys to set for one's own batch,
number of training images and GPUs, printed as a yaml config's keys and as a LazyConfig's
``key=value`` overrides, with the study rows behind them::

    largedet-recipe --batch 1056 --images 118287 --gpus 8

A batch that does not split over the GPUs is one line on stderr naming what would, exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from largedet.solver.recipe import COSTLY_SHARE, Recipe, RecipeError, detection_recipe


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="The large-batch detection recipe's config keys for your batch, your number "
        "of training images and your GPUs (docs/recipes.md)."
    )
    parser.add_argument("--batch", type=int, required=True, help="global batch: images per optimizer step")
    parser.add_argument("--images", type=int, required=True, help="training images of your dataset")
    parser.add_argument("--gpus", type=int, default=1, help="devices of the run, all machines (default 1)")
    parser.add_argument("--ims-per-device", type=int, default=4,
                        help="images one device holds per pass (default 4: R50-FPN at COCO's size)")  # fmt: skip
    parser.add_argument("--epochs", type=float, default=1.4,
                        help="x the 1x schedule's epochs (default 1.4, the recipe's; 1 and 2 measured too)")  # fmt: skip
    return parser


def _yaml_value(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + (",)" if len(value) == 1 else ")")
    return str(value)


def yaml_lines(recipe: Recipe) -> List[str]:
    """The recipe's keys as the lines of a yaml config (nested, in order)."""
    lines: List[str] = []
    open_groups: List[str] = []
    for key, value in recipe.yaml_keys():
        *groups, name = key.split(".")
        depth = 0
        while depth < min(len(groups), len(open_groups)) and groups[depth] == open_groups[depth]:
            depth += 1
        for level in range(depth, len(groups)):
            lines.append("  " * level + f"{groups[level]}:")
        open_groups = groups
        lines.append("  " * len(groups) + f"{name}: {_yaml_value(value)}")
    return lines


def report(recipe: Recipe) -> List[str]:
    """What the command prints for ``recipe``."""
    lines = [
        f"batch {recipe.batch} of {recipe.images:,} training images: {100 * recipe.share:.2f}% of the "
        f"data per step; {recipe.gpus} GPU(s) x {recipe.ims_per_device} images x "
        f"{recipe.accumulation} accumulated micro-batch(es)",
        f"1x schedule: {recipe.one_x_steps} steps; {recipe.epochs_factor:g}x: {recipe.max_iter} steps "
        f"({recipe.max_iter * recipe.batch:,} images, {recipe.max_iter * recipe.batch / recipe.images:.1f} "
        f"epochs); peak LR {recipe.peak_lr:.4g} (square-root rule)",
    ]
    if recipe.share >= COSTLY_SHARE:
        lines.append(
            f"warning: {100 * recipe.share:.1f}% of the data per step: at {100 * COSTLY_SHARE:.1f}% and "
            "above every recipe measured cost AP (docs/recipes.md); a smaller batch, or more images"
        )
    lines += ["", "# yaml: a config on configs/Base-LargeDet-RCNN-FPN.yaml", *yaml_lines(recipe), ""]
    lines += [
        "# LazyConfig: tools/lazyconfig_train_net.py overrides (optimizer = L(PMDLAMB)(...))",
        " ".join(recipe.lazy_overrides()),
        "# and the schedule, in the config file: the peak LR until 0.8 of the run, then linear to 0",
        "# lr_multiplier = L(CompositeParamScheduler)(schedulers=[L(ConstantParamScheduler)(value=1.0), "
        "L(LinearParamScheduler)(start_value=1.0, end_value=0.0)], lengths=[0.8, 0.2], "
        "interval_scaling=['rescaled', 'rescaled'])",
        "",
        f"evidence: {recipe.evidence()}",
    ]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = argument_parser().parse_args(argv)
    try:
        recipe = detection_recipe(args.batch, args.images, args.gpus, args.ims_per_device, args.epochs)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(report(recipe)))
