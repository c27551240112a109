#!/usr/bin/env python3
"""Submit a training run to Slurm through submitit; requeued on pre-emption and time-out, it
resumes from its last checkpoint by itself.

    python tools/submit.py --config configs/r50_fpn_bs1056.yaml --nodes 33 --gpus-per-node 8 \\
        --partition learnfair --time 240
    python tools/submit.py --config configs/shapes/lazy/faster_rcnn_R18_FPN_pmdlamb_bs1024.py \\
        --nodes 1 --gpus-per-node 8 --partition P train.max_iter=600
    python tools/submit.py --video --config projects/video/configs/kinetics400_tsm_r50_8f.yaml \\
        --nodes 4 --gpus-per-node 8 --partition P --time 720
    python tools/submit.py --local --gpus-per-node 2 --config shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml
    python tools/submit.py --config configs/r50_fpn_bs1056.yaml --nodes 33 --gpus-per-node 8 \
        --srun --account A --qos high --constraint volta32gb --exclude 'node[01-04]' \
        --sbatch mail-type=END --sbatch exclusive --no-data-check
    python tools/submit.py --gpus-per-node 0 --processes-per-node 2 --cpus-per-gpu 4 \
        --config configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml
    python tools/submit.py --config configs/r50_fpn_bs1056.yaml --nodes 12 --gpus-per-node 8 \
        --elastic 11 --max-restarts 5 SOLVER.IMS_PER_DEVICE 1

The run is tools/train_net.py's (python -m largedet.engine.train_net), tools/lazyconfig_train_net.py
for a .py (LazyConfig) config, or projects/video/train.py's with --video (python -m
largedet_video.engine.train_net); the config and the trailing overrides are given to it as to
that script. The wheel's command largedet-submit is this script (largedet.cli.submit). Each node runs it once with --num-gpus GPUS_PER_NODE and Detectron2's
multi-machine flags (largedet.launch.slurm); with --srun each training process is a Slurm task
of its own, which joins the process group from Slurm's variables (--launcher slurm).
--gpus-per-node 0 asks for no GPUs: --processes-per-node CPU processes (default 1), one core
each unless --cpus-per-gpu says otherwise. --config takes a file or the name of one of
largedet's configs, as train_net.py does. A
detection config is checked here, as the script checks it, for nodes x processes before
anything is queued, its data files included unless --no-data-check (the job's machines may
see a file system this one does not; the script checks them again at job start). --elastic MIN
runs each node's processes under an elastic torchrun agent (--nnodes MIN:NODES, c10d rendezvous
on the first node): a lost node's survivors restart on the nodes left and resume from the newest
complete checkpoint (docs/launching.md, "Elastic runs"); the config is checked for every node
count from MIN to NODES. --local
runs the job on this machine under submitit's local executor (one node; without GPUs,
--gpus-per-node CPU processes), through the same signal, checkpoint and requeue path.
"""

from largedet.cli.submit import argument_parser, check, main, sbatch_options

__all__ = ["argument_parser", "check", "main", "sbatch_options"]

if __name__ == "__main__":
    main()
