#!/usr/bin/env python3
"""The video batch-scaling study: TSM top-1 against the global batch, SGD with the linear
rule and PMD-LAMB, every batch the same epochs (a miniature of "Training Kinetics in 15
Minutes"; the grid is in ``video_study.grid``).

    python study/video_batch_study.py --dry-run     # cells, LR, steps, batch/N
    # two processes at once (about 30 min per cell on one core), resumable
    for i in 1 2; do nice python study/video_batch_study.py \\
        --csv study/results/video/batch_study.csv \\
        --archive study/results/video/batch_study_runs & done
    python study/plot_video_batch_study.py study/results/video/batch_study.csv

Cells already in the CSV are skipped; an interrupted cell resumes from its last checkpoint.
"""

import sys

from video_study.runner import main

if __name__ == "__main__":
    sys.exit(main())
