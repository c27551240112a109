#!/usr/bin/env python3
"""The large-batch study: box AP against global batch for each optimizer.

Trains the same detector on the same data through ``tools/train_net.py`` (one subprocess
per cell, gradient accumulation where the batch exceeds one pass), evaluates box AP and
appends one CSV row per cell. The grids, cells, per-cell plan and CSV columns are in
:mod:`largedet_study.grid` (the runner: :mod:`largedet_study.runner`).

    python study/batch_scaling_study.py --dry-run       # the plan: cells, LR, iterations
    # the steps-matched CPU grid (about 45 min per cell on one core), two processes at once
    for i in 1 2; do nice python study/batch_scaling_study.py \
        --csv study/results/batch_scaling_steps.csv \
        --archive study/results/batch_scaling_steps_runs & done
    python study/batch_scaling_study.py --grid short    # the short-budget grid (16 epochs)
    python study/batch_scaling_study.py --grid regime --dry-run   # COCO's regime: N, batch/N, epochs
    python study/batch_scaling_study.py --grid gpu --num-gpus 8
    python study/plot_study.py --study study/results/batch_scaling_steps.csv

Resumable: cells already in the CSV are skipped, and an interrupted cell resumes from
its last checkpoint (``--resume``); its wall-clock adds up over the invocations. Several
copies of this script may run at once on the same output directory (each cell is claimed
with a lock file), for example one per core. A run that the divergence guard stops
(non-finite or exploding loss) is a result: ``diverged`` is ``yes`` and AP is empty. Any
other failure is reported and retried the next time the script runs.
"""

import sys

from largedet_study.runner import main

if __name__ == "__main__":
    sys.exit(main())
