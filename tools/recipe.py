#!/usr/bin/env python3
"""The large-batch detection recipe's config keys for your batch, number of training images
and GPUs (``largedet-recipe`` once installed; docs/recipes.md):

    python tools/recipe.py --batch 1056 --images 118287 --gpus 8

Prints the keys as a yaml config's and as a LazyConfig's ``key=value`` overrides, and the
study rows behind them; a batch that does not split over the GPUs is one line, exit 2.
"""

from largedet.cli.recipe import main

if __name__ == "__main__":
    main()
