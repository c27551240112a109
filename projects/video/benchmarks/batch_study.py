#!/usr/bin/env python3
"""The video batch-scaling study: TSM top-1 against the global batch, SGD with the linear
rule and PMD-LAMB, every batch the same epochs (a miniature of "Training Kinetics in 15
Minutes"; the grid is in ``video_study.grid``).

    python projects/video/benchmarks/batch_study.py --dry-run     # cells, LR, steps, batch/N
    # two processes at once (about 30 min per cell on one core), resumable
    for i in 1 2; do nice python projects/video/benchmarks/batch_study.py \\
        --csv projects/video/benchmarks/results/batch_study.csv \\
        --archive projects/video/benchmarks/results/batch_study_runs & done
    python projects/video/benchmarks/plot_batch_study.py projects/video/benchmarks/results/batch_study.csv

Cells already in the CSV are skipped; an interrupted cell resumes from its last checkpoint.
"""

import os
import sys

# the detection study's runner (largedet_study) is in the repository's benchmarks/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks"))

from video_study.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
