#!/usr/bin/env python3
"""Run cells of the batch-scaling study side by side on one GPU machine, under a deadline.

    python3 study/study_cells_on_gpu.py --grid regime --cells CELL [CELL ...] \\
        --pretrain FILE --deadline 540 --pack $OUT [--workers 2] [--resume-from DIR]

For a lent GPU machine that gives back only a few files and stops every command at a limit:
installs what does not import from ``--wheels`` (:mod:`largedet_study.gpu_machine`),
puts ``--pretrain`` (the grid's ``pretrain/backbone.pth``, made on the CPU) where the study
looks for it, and starts one ``study/batch_scaling_study.py --only CELL`` per cell at
once, each with ``DATALOADER.NUM_WORKERS`` set to ``--workers`` (the CPU grid loads in
the training process), TF32 off (``NVIDIA_TF32_OVERRIDE=0``: float32 convolutions and
products, as on the CPU) and, for several cells, CUDA's multi-process service (MPS).
Every 20 s it prints each cell's iteration, rate and ETA. At ``--deadline`` seconds the
study processes get SIGTERM: each training process writes its pre-emption checkpoint and
the cell resumes from it wherever the study runs next (here with ``--resume-from``, or on
a CPU with the files copied into the grid's output directory).

Measured on one H100 (2026-11-26, benchmarks/RESULTS.md "Study cells on the GPU"): the
study's detector takes about 91 ms per 16-image pass alone, 98-105 ms with three cells
under MPS and 325 ms with five without it (their kernels take turns on the GPU); a regime
cell at 1.0x (18,432 passes) is about half an hour of one process.

``--pack DIR`` writes at most 8 files: ``cells_<i>.tar.gz`` (each under 15 MiB, the run
directories with only the checkpoint named in ``last_checkpoint``) and ``study.tar.gz``
(the CSV of the finished cells, their archives, this script's log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from typing import Dict

from largedet_study.gpu_cells import pack_cells, progress, seconds_per_iteration, unpack_cells
from largedet_study.gpu_machine import prepare_machine

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MAX_FILES = 8


def log(msg: str, log_file) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    log_file.write(line + "\n")
    log_file.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="regime")
    parser.add_argument("--cells", nargs="+", required=True)
    parser.add_argument("--pretrain", default=None, help="the grid's pretrain/backbone.pth")
    parser.add_argument("--deadline", type=float, required=True, help="seconds, then SIGTERM")
    parser.add_argument("--pack", default=None, help="folder for the (at most 8) result files")
    parser.add_argument("--workers", type=int, default=2, help="data-loading workers per cell")
    parser.add_argument("--output-dir", default=None,
                        help="default: output/batch_scaling_study/GRID_gpu")  # fmt: skip
    parser.add_argument("--resume-from", default=None,
                        help="a folder of cells_<i>.tar.gz from an earlier run: unpacked first")  # fmt: skip
    parser.add_argument("--wheels", default=os.path.join(REPO, ".whl"))
    parser.add_argument("--site", default="/tmp/largedet_study_site")
    parser.add_argument("--label", default=None, help="--device-label of the CSV rows")
    parser.add_argument("--no-mps", action="store_true",
                        help="do not start CUDA's multi-process service for several cells")  # fmt: skip
    args = parser.parse_args(argv)
    start = time.monotonic()
    output_dir = args.output_dir or os.path.join(REPO, "output", "batch_scaling_study",
                                                 f"{args.grid}_gpu")  # fmt: skip
    os.makedirs(output_dir, exist_ok=True)
    log_file = open(os.path.join(output_dir, "study_cells_on_gpu.log"), "a")
    env, info = prepare_machine(REPO, args.site, args.wheels)
    if info["missing"]:
        log(f"not importable: {', '.join(info['missing'])}", log_file)
        return 2
    device = info.get("device") or "?"
    log(f"set up in {time.monotonic() - start:.0f} s; {json.dumps(info)[:600]}", log_file)
    if args.resume_from:
        for bundle in unpack_cells(args.resume_from, output_dir):
            log(f"unpacked {bundle}", log_file)
    if args.pretrain:
        os.makedirs(os.path.join(output_dir, "pretrain"), exist_ok=True)
        shutil.copy(args.pretrain, os.path.join(output_dir, "pretrain", "backbone.pth"))
    label = args.label or f"{device}, float32 (TF32 off), {args.workers} loader workers"
    env = dict(env, NVIDIA_TF32_OVERRIDE="0")
    csv_path = os.path.join(output_dir, "study.csv")
    mps = None
    if len(args.cells) > 1 and not args.no_mps and shutil.which("nvidia-cuda-mps-control"):
        # without it the processes' kernels take turns on the GPU: 3.5x slower per cell
        mps = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True)
        log(f"MPS daemon: exit {mps.returncode} {mps.stdout.strip()} {mps.stderr.strip()}", log_file)
    procs = {}
    for cell in args.cells:
        cmd = [sys.executable, os.path.join(HERE, "batch_scaling_study.py"), "--grid", args.grid,
               "--only", cell, "--output-dir", output_dir, "--csv", csv_path,
               "--archive", os.path.join(output_dir, "archive"), "--device-label", label,
               "--set", "DATALOADER.NUM_WORKERS", str(args.workers)]  # fmt: skip
        out = open(os.path.join(output_dir, f"runner_{cell}.txt"), "a")
        procs[cell] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        log(f"started {cell} (pid {procs[cell].pid})", log_file)
    first: Dict[str, tuple] = {}
    while time.monotonic() - start < args.deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(min(20.0, max(0.5, args.deadline - (time.monotonic() - start))))
        now = time.monotonic()
        parts = []
        for cell, proc in procs.items():
            pr = progress(os.path.join(output_dir, cell))
            first.setdefault(cell, (now, pr["iteration"]))
            t0, i0 = first[cell]
            rate = (pr["iteration"] - i0) / (now - t0) if now > t0 else 0.0
            eta = (pr["max_iter"] - pr["iteration"]) / rate if rate > 0 else float("nan")
            state = "running" if proc.poll() is None else f"exit {proc.returncode}"
            parts.append(f"{cell} {pr['iteration']}/{pr['max_iter']} {rate:.2f} it/s "
                         f"eta {eta:.0f} s {state}")  # fmt: skip
        log(f"t={now - start:.0f} s | " + " | ".join(parts), log_file)
    for cell, proc in procs.items():
        if proc.poll() is None:  # the study stops its training process, which checkpoints
            proc.send_signal(signal.SIGTERM)
    for cell, proc in procs.items():
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        pr = progress(os.path.join(output_dir, cell))
        per_iter = seconds_per_iteration(os.path.join(output_dir, cell, "log.txt"))
        log(f"{cell}: exit {proc.returncode}, iteration {pr['iteration']}/{pr['max_iter']}, "
            f"{per_iter if per_iter is not None else '?'} s per iteration", log_file)  # fmt: skip
    if mps is not None and mps.returncode == 0:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True)
    if args.pack:
        os.makedirs(args.pack, exist_ok=True)
        written = pack_cells(output_dir, args.cells, args.pack, MAX_FILES - 1)
        log(f"packed {', '.join(os.path.basename(w) for w in written)}", log_file)
        log_file.close()
        with tarfile.open(os.path.join(args.pack, "study.tar.gz"), "w:gz") as tar:
            for name in ["study.csv", "archive", "study_cells_on_gpu.log"] + [
                f"runner_{c}.txt" for c in args.cells
            ]:
                if os.path.exists(os.path.join(output_dir, name)):
                    tar.add(os.path.join(output_dir, name), arcname=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
