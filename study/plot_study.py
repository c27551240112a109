#!/usr/bin/env python3
"""Figures of the batch-scaling study, from its CSVs (a training run's own curves:
``tools/plot_metrics.py --runs``).

    # AP vs global batch, images/s per run, and the Markdown table of the study
    python study/plot_study.py --study study/results/batch_scaling_cpu.csv --out-dir study/results/figures
    # and every cell at one batch (sweeps included), held-out and reported AP
    python study/plot_study.py --study study/results/batch_scaling_steps.csv --cells-at-batch 1024
    # the gap to batch 16 against the epoch budget, two grids side by side (LABEL=CSV[,EVAL_CSV])
    python study/plot_study.py --compare \
        "batch = 67% of N=study/results/batch_scaling_steps.csv,study/results/batch_scaling_steps_eval2000.csv" \
        "batch = 1% of N=study/results/batch_scaling_regime.csv" --out-dir study/results/figures --prefix regimes_
"""

import argparse
import os
import sys

from largedet_study.plotting import (
    load_study,
    epoch_curve,
    plot_ap_vs_batch,
    plot_ap_vs_epochs,
    plot_cells_at_batch,
    plot_regimes,
    plot_throughput,
    regime_gaps,
    regime_table,
    study_table,
    with_reevaluation,
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--study", help="the CSV written by study/batch_scaling_study.py")
    parser.add_argument("--out-dir", default=".", help="where the PNG files go")
    parser.add_argument("--prefix", default="", help="file-name prefix of the figures")
    parser.add_argument("--title", default="", help="title suffix (e.g. the machine)")
    parser.add_argument(
        "--cells-at-batch",
        type=int,
        default=None,
        metavar="B",
        help="with --study: also every cell at global batch B, held-out and reported AP",
    )
    parser.add_argument(
        "--eval-csv",
        default=None,
        help="with --study: the held-out and reported AP of this larger evaluation "
        "(batch_scaling_study.py --eval-images N) instead of the study CSV's, in every "
        "figure and the table; cells it lacks are left out",
    )
    parser.add_argument(
        "--compare",
        nargs="*",
        default=(),
        metavar="LABEL=CSV[,EVAL_CSV]",
        help="grids to compare: the gap of each PMD-LAMB batch to its own batch-16 baseline "
        "against the epoch budget (gap_vs_epochs.png) and its table; EVAL_CSV: a larger "
        "evaluation of that grid's cells (batch_scaling_study.py --eval-images N)",
    )
    args = parser.parse_args(argv)
    if not args.study and not args.compare:
        parser.error("nothing to plot: give --study CSV and/or --compare")
    compare = []
    for entry in args.compare:
        label, sep, files = entry.rpartition("=")
        if not sep or not label or not files:
            parser.error(f"--compare {entry!r}: expected LABEL=CSV[,EVAL_CSV]")
        compare.append((label, *files.split(",", 1)))
    if args.eval_csv and not args.study:
        parser.error("--eval-csv goes with --study")
    os.makedirs(args.out_dir, exist_ok=True)
    suffix = f" ({args.title})" if args.title else ""
    written = []
    try:
        if args.study:
            rows = load_study(args.study)
            if not rows:
                parser.error(f"{args.study}: no rows yet")
            written.append(plot_throughput(rows, os.path.join(args.out_dir, f"{args.prefix}images_per_s.png"),
                                           title=f"Training images/s per run{suffix}"))  # fmt: skip
            images, counted = None, ""
            if args.eval_csv:
                rows, images = with_reevaluation(rows, args.eval_csv)
                counted = f"\nreported split, {images} images"
            written.append(plot_ap_vs_batch(rows, os.path.join(args.out_dir, f"{args.prefix}ap_vs_batch.png"),
                                            title=f"Box AP vs global batch, same epochs{suffix}{counted}"))  # fmt: skip
            if any(p.factor != 1.0 for p in epoch_curve(rows)[0]):
                written.append(plot_ap_vs_epochs(rows, os.path.join(args.out_dir, f"{args.prefix}ap_vs_epochs.png"),
                                                 title=f"Box AP against the epoch budget{suffix}"
                                                 + (f"\n{images} images of each split" if images else "")))  # fmt: skip
            if args.cells_at_batch is not None:
                path = os.path.join(args.out_dir, f"{args.prefix}cells_at_{args.cells_at_batch}.png")
                plot_cells_at_batch(rows, args.cells_at_batch, path, images=images,
                                    title=f"Every cell at batch {args.cells_at_batch}{suffix}")  # fmt: skip
                written.append(path)
            print(study_table(rows))
        if compare:
            regimes = []
            for label, study_csv, *evaluation in compare:
                rows = load_study(study_csv)
                if evaluation:
                    rows, _ = with_reevaluation(rows, evaluation[0])
                regimes.append((label, rows))
            written.append(plot_regimes(regimes, os.path.join(args.out_dir, f"{args.prefix}gap_vs_epochs.png"),
                                        title=f"The gap to batch 16 against the epoch budget{suffix}"))  # fmt: skip
            print(regime_table(regime_gaps(regimes)))
    except (FileNotFoundError, ValueError) as e:
        print(f"plot_study: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
