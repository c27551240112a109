#!/usr/bin/env python3
"""The studies' numbers in the docs, written from their CSVs (:mod:`largedet_study.report`).

    python study/study_report.py            # regenerate every marked table and number
    python study/study_report.py --check    # exit 1 naming each file that differs
    python study/study_report.py --goal     # the regime and video grids' checks, the optimizer table, multigrid's verdict (exit 1: goal not met)
    python study/study_report.py --block regime-comparison   # print one block
    python study/study_report.py --figures  # the comparison tables as pictures (interval_plot), mg_time's figure
"""

import argparse
import sys

from largedet_study import report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    group.add_argument("--goal", action="store_true", help="print the regime grid's goal check")
    group.add_argument("--block", choices=sorted(report.BLOCKS), help="print one generated block")
    group.add_argument("--figures", action="store_true", help="draw the comparison tables' figures")
    args = parser.parse_args(argv)
    if args.figures:
        from largedet_study import interval_plot, mg_time_report

        for path in interval_plot.draw() + mg_time_report.draw():
            print(f"wrote {path}")
        return 0
    if args.block:
        print(report.BLOCKS[args.block]())
        return 0
    if args.goal:
        print("Detection, regime grid:\n" + report.regime_verdict())
        print("\nThe optimizers at batch 256 (regime grid):\n" + report.regime_optimizers())
        print("\nVideo, tsm4k grid:\n" + report.video_verdict("video4k"))
        print("\nVideo, tsm4k grid on one EPYC-Zen5 VM, both sides tuned alike:\n" + report.video_verdict("video4k_zen5"))
        print("\nMultigrid's time to accuracy, mg_time grid:\n" + report.BLOCKS["mg-time-verdict"]())
        print("\nMultigrid's time to accuracy at base batch 16, mg_time16 grid:\n" + report.BLOCKS["mg-time16-verdict"]())
        print("\nMultigrid's time to accuracy on the 64-px, 16-frame task, mg_time64 grid:\n"
              + report.BLOCKS["mg-time64-verdict"]())
        return 0 if report.regime_goal() else 1
    if args.check:
        stale = report.check()
        for path in stale:
            print(f"{path}: generated numbers differ from the CSVs; run python study/study_report.py")
        return 1 if stale else 0
    for path in report.write():
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
