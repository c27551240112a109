#!/usr/bin/env python3
"""Loss and LR against epochs for several training runs, from their metrics.json.

    # loss and LR against epochs for several runs (their OUTPUT_DIRs)
    python tools/plot_metrics.py --runs output/run_a output/run_b --labels A B --out-dir figs

Epochs are iteration x global batch / training images, so runs at different batches
line up. The number of training images is read from each run's run_summary.json (or --num-train).
The batch-scaling study's figures come from its own script, ``study/plot_study.py``.
"""

import argparse
import os
import sys

from largedet.utils.run_curves import load_run, plot_curves


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", nargs="+", required=True, help="OUTPUT_DIRs of training runs")
    parser.add_argument("--labels", nargs="*", default=None, help="one label per --runs entry")
    parser.add_argument(
        "--num-train", type=int, default=None, help="training images (default: from each run's run_summary.json)"
    )
    parser.add_argument("--out-dir", default=".", help="where the PNG file goes")
    parser.add_argument("--prefix", default="", help="file-name prefix of the figure")
    parser.add_argument("--title", default="", help="title suffix (e.g. the machine)")
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels has {len(args.labels)} entries for {len(args.runs)} --runs")
    suffix = f" ({args.title})" if args.title else ""
    try:
        labels = args.labels or [None] * len(args.runs)
        runs = [load_run(d, label or "", num_train=args.num_train) for d, label in zip(args.runs, labels)]
        os.makedirs(args.out_dir, exist_ok=True)
        path = plot_curves(runs, os.path.join(args.out_dir, f"{args.prefix}loss_lr_vs_epochs.png"),
                           title=f"Loss and LR against epochs{suffix}")  # fmt: skip
    except (FileNotFoundError, ValueError) as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
