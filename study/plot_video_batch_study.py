#!/usr/bin/env python3
"""The video batch study's figure (top-1 against the global batch) and its Markdown table.

    python study/plot_video_batch_study.py \\
        study/results/video/batch_study.csv --out study/results/video/figures
"""

import argparse
import os
import sys

from video_study.grid import NUM_TRAIN
from video_study.plotting import load_video_study, plot_top1_vs_batch, video_table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="the CSV written by video_batch_study.py")
    parser.add_argument("--out", default=".", help="folder of top1_vs_batch.png")
    parser.add_argument("--title", default="", help="the figure's title")
    args = parser.parse_args(argv)
    try:
        rows = load_video_study(args.csv)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"plot_batch_study: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"plot_batch_study: {args.csv}: no rows yet", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = plot_top1_vs_batch(rows, os.path.join(args.out, "top1_vs_batch.png"), NUM_TRAIN, args.title)
    print(video_table(rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
