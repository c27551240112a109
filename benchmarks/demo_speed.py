#!/usr/bin/env python3
"""Seconds per training step of the demo against the main job its config builds on, in
fresh processes taking turns on the same machine.

    python benchmarks/demo_speed.py --rounds 3 --iters 150

Each round trains the main job (``configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml``: ResNet-18,
float32, 64 RoIs per image) and the demo (``faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml``: a
ResNet-10 at 32-256 channels, bfloat16 where the CPU has it, 32 RoIs per image) for ``--iters`` steps each, in a new process each, without evaluation, and
reads Detectron2's per-step ``time`` from ``metrics.json`` after the first ``--skip`` steps
(start-up, first allocations). Prints each run's median seconds per step, the demo's speed-up
in each round (main / demo) and the spread over rounds. Needs a quiet machine.

``--full`` runs the whole demo instead (``tools/train_net.py --config <demo config>``:
training, then evaluation), ``--runs`` times in fresh processes, and appends one row per run
to ``--csv`` (default ``benchmarks/results/demo_speed.csv``): the date, the CPU (model name,
family and model, the instruction sets that decide the demo's precision), the precision it
trained in, torch, the training time Detectron2 reports ("Overall training speed"), the
seconds per step and the box AP::

    python benchmarks/demo_speed.py --full --runs 2

The machine class's row is what the 300-second demo target is checked against.

``--check`` reads that CSV for this machine's class and exits 1 unless the demo's config (no
overrides) has rows there, each within 300 s of training at >= 60 box AP. Rows name the config
file, not its contents: a change to the demo's config retires its rows (rename them with the
overrides that give the old run, as the CSV's earlier rows show).

``--lever NAME="KEY VALUE ..."`` (repeatable) measures a candidate change to the demo
instead: each round trains the demo and the demo with each lever's overrides for ``--iters``
steps, in fresh processes taking turns, and appends a row per lever and round to
``benchmarks/results/demo_levers.csv`` (the demo's seconds per step over the lever's)::

    python benchmarks/demo_speed.py --rounds 3 --lever "workers0=DATALOADER.NUM_WORKERS 0"
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

#: the demo's targets: at most five minutes of training at at least 60 box AP (the study's
#: report of demo_speed.csv, largedet_study.demo_report, says "met" by the same two numbers)
TARGET_S, TARGET_AP = 300, 60.0


def runs_missing_targets(runs):
    """The rows of demo_speed.csv among ``runs`` over ``TARGET_S`` seconds of training, under
    ``TARGET_AP`` box AP, or without an AP."""
    return [r for r in runs if float(r["training_s"]) > TARGET_S or not r["box_ap"] or float(r["box_ap"]) < TARGET_AP]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "main job": os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml"),
    "demo": os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml"),
}


def seconds_per_step(config: str, iters: int, skip: int, workdir: str, overrides=(), tag: str = "") -> float:
    """Median of the logged per-step times of a fresh ``iters``-step run of ``config`` with
    ``overrides`` (KEY VALUE ...); ``tag`` names its output folder."""
    out = os.path.join(workdir, os.path.basename(config) + (f"-{tag}" if tag else ""))
    cmd = [sys.executable, "-m", "largedet.engine.train_net", "--config", config,
           "SOLVER.MAX_ITER", str(iters), "SOLVER.CHECKPOINT_PERIOD", str(10 * iters),
           "LOG_PERIOD", "10", "DATASETS.TEST", "()", *overrides, "OUTPUT_DIR", out]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"{config}: training failed (exit {proc.returncode}):\n{tail}")
    times = []
    with open(os.path.join(out, "metrics.json")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("iteration", -1) >= skip and "time" in record:
                times.append(record["time"])
    if not times:
        raise RuntimeError(f"{config}: no step times after step {skip} in metrics.json")
    return statistics.median(times)


#: the CSV of ``--full`` runs
DEMO_CSV = os.path.join(ROOT, "benchmarks", "results", "demo_speed.csv")
DEMO_FIELDS = [
    "date", "cpu", "cpu_family_model", "isa", "cores", "precision", "torch", "iterations",
    "training_s", "s_per_step", "box_ap", "label", "config",
]  # fmt: skip
#: the flags that tell the x86 classes apart for the demo (its precision and its kernels)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
_SPEED = re.compile(r"Overall training speed: (\d+) iterations in (\d+):(\d\d):(\d\d) \(([\d.]+) s / it\)")


def cpu_class() -> dict:
    """The CPU's model name, family/model and the ``ISA_FLAGS`` it has (/proc/cpuinfo)."""
    info = {"cpu": platform.processor() or platform.machine(), "family": "", "model": ""}
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "model name" and "model_name" not in info:
                    info["cpu"] = info["model_name"] = value
                elif key == "cpu family" and not info["family"]:
                    info["family"] = value
                elif key == "model" and not info["model"]:
                    info["model"] = value
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": info["cpu"],
        "cpu_family_model": f"{info['family']}/{info['model']}" if info["family"] else "",
        "isa": " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + " ".join(ISA_FLAGS),
        "cores": str(os.cpu_count() or ""),
    }


def parse_demo_log(text: str) -> dict:
    """Iterations, training seconds and seconds per step from Detectron2's "Overall training
    speed" line of a run's log; ValueError where it is missing."""
    m = _SPEED.search(text)
    if m is None:
        raise ValueError("no 'Overall training speed' line in the run's log")
    iterations, h, mi, sec, per_step = m.groups()
    return {
        "iterations": int(iterations),
        "training_s": int(h) * 3600 + int(mi) * 60 + int(sec),
        "s_per_step": float(per_step),
    }


def last_box_ap(metrics_path: str) -> str:
    """The last ``bbox/AP`` (or ``<set>/bbox/AP``) in a metrics.json, two decimals; "" if none."""
    ap = ""
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            for key, value in record.items():
                if key == "bbox/AP" or key.endswith("/bbox/AP"):
                    ap = f"{value:.2f}"
    return ap


def full_demo(workdir: str, overrides=()) -> dict:
    """One whole demo run in a fresh process: its CSV row (without date and label)."""
    import torch

    from largedet.config import add_largedet_config, amp_dtype
    from detectron2.config import get_cfg

    out = os.path.join(workdir, "demo")
    config = CONFIGS["demo"]
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config", config,
           "--overwrite", "OUTPUT_DIR", out, *overrides]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"the demo failed (exit {proc.returncode}):\n{tail}")
    with open(os.path.join(out, "log.txt")) as f:
        row = parse_demo_log(f.read())
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(config)
    cfg.merge_from_list(list(overrides))
    dtype = amp_dtype(cfg)
    row.update(cpu_class())
    row["precision"] = "float32" if dtype is None else str(dtype).replace("torch.", "")
    row["torch"] = torch.__version__
    row["box_ap"] = last_box_ap(os.path.join(out, "metrics.json"))
    row["config"] = " ".join([os.path.basename(config), *overrides])  # what ran, overrides included
    return row


def append_rows(path: str, rows, fields=None) -> None:
    """Append ``rows`` (dicts; a missing field is written empty) to the CSV at ``path``, with
    the header ``fields`` (default: demo_speed.csv's) first where the file is new or empty.
    The benchmarks that write result CSVs all append through here."""
    fields = fields or DEMO_FIELDS
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in fields})


def main_full(args) -> None:
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as workdir:
            row = full_demo(workdir, args.overrides)
        row["date"] = datetime.date.today().isoformat()
        row["label"] = args.label
        rows.append(row)
        append_rows(args.csv, [row])  # each run as it ends
        print(f"run {run + 1}: {row['iterations']} steps trained in {row['training_s']} s "
              f"({row['s_per_step']:.4f} s/step, {row['precision']}), box AP {row['box_ap']}; "
              f"{row['cpu']} ({row['isa']})", flush=True)  # fmt: skip
    times = [r["training_s"] for r in rows]
    print(f"training: {min(times)}-{max(times)} s over {len(rows)} run(s); rows in {args.csv}")


#: the CSV of ``--lever`` rounds
LEVERS_CSV = os.path.join(ROOT, "benchmarks", "results", "demo_levers.csv")
LEVER_FIELDS = [
    "date", "cpu", "cpu_family_model", "isa", "cores", "torch", "lever", "overrides", "round",
    "iters", "demo_s_per_step", "lever_s_per_step", "speedup", "label", "demo",
]  # fmt: skip


def parse_lever(text: str) -> tuple:
    """``"NAME=KEY VALUE ..."`` -> (NAME, [KEY, VALUE, ...]); ValueError naming the text."""
    name, sep, overrides = text.partition("=")
    words = overrides.split()
    if not sep or not name.strip() or not words or len(words) % 2:
        raise ValueError(f"--lever {text!r}: expected NAME=KEY VALUE [KEY VALUE ...]")
    return name.strip(), words


def main_levers(args, levers, measure=seconds_per_step) -> dict:
    """Each round: the demo as it is, then the demo with each lever's overrides, each a
    fresh ``--iters``-step run; a row per lever and round in ``args.csv`` (the demo's seconds
    per step over the lever's: its speed-up). Returns {lever: [speed-up per round]}."""
    import torch

    speedups = {name: [] for name, _ in levers}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            base = measure(CONFIGS["demo"], args.iters, args.skip, os.path.join(workdir, str(r)))
            rows = []
            for name, overrides in levers:
                t = measure(CONFIGS["demo"], args.iters, args.skip, os.path.join(workdir, str(r)), overrides, name)
                speedups[name].append(base / t)
                rows.append({**cpu_class(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                             "lever": name, "overrides": " ".join(overrides), "round": r + 1, "iters": args.iters,
                             "demo_s_per_step": f"{base:.4f}", "lever_s_per_step": f"{t:.4f}",
                             "speedup": f"{base / t:.3f}", "label": args.label,
                             "demo": os.path.basename(CONFIGS["demo"])})  # fmt: skip
                print(f"round {r + 1}: demo {base:.3f} s/step, {name} {t:.3f} s/step: {base / t:.3f}x", flush=True)
            append_rows(args.csv, rows, LEVER_FIELDS)
    for name, values in speedups.items():
        print(f"{name}: speed-up {min(values):.3f}-{max(values):.3f}x over {len(values)} round(s) "
              f"(median {statistics.median(values):.3f}x); rows in {args.csv}")  # fmt: skip
    return speedups


def check_class(path: str, machine: dict) -> tuple:
    """The target on one machine class: the rows of ``path`` for the demo's config as it is
    (no overrides) on ``machine``'s CPU, family/model and instruction sets. Returns (met,
    message); not met where there is no such row or any row is over 300 s or under 60 AP."""
    demo = os.path.basename(CONFIGS["demo"])
    keys = ("cpu", "cpu_family_model", "isa")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("config") == demo and all(r[k] == machine[k] for k in keys)]
    where = f"{machine['cpu']} ({machine['cpu_family_model']}, {machine['isa']})"
    if not rows:
        return False, f"no run of {demo} on {where} in {path}: run --full on it first"
    bad = runs_missing_targets(rows)
    seconds = sorted(int(r["training_s"]) for r in rows)
    aps = sorted(float(r["box_ap"] or 0) for r in rows)
    summary = (f"{len(rows)} run(s) of {demo} on {where}: training {seconds[0]}-{seconds[-1]} s, "
               f"box AP {aps[0]:.1f}-{aps[-1]:.1f}")  # fmt: skip
    if bad:
        return False, f"{summary}: {len(bad)} over {TARGET_S} s or under {TARGET_AP:.0f} AP"
    return True, f"{summary}: every run within {TARGET_S} s at >= {TARGET_AP:.0f} AP"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=150, help="steps per run")
    parser.add_argument("--skip", type=int, default=30, help="first steps left out")
    parser.add_argument("--full", action="store_true", help="run the whole demo (see above)")
    parser.add_argument("--runs", type=int, default=1, help="--full: demo runs")
    parser.add_argument("--csv", default=DEMO_CSV, help="--full: the CSV to append to")
    parser.add_argument("--label", default="", help="--full: a note for the rows (e.g. the VM)")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME=KEY VALUE ...",
                        help="rounds of the demo against the demo with these overrides (repeatable); "
                             "rows in --csv (default benchmarks/results/demo_levers.csv)")  # fmt: skip
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless this machine's class has --full rows of the demo, each within "
                             "300 s at >= 60 box AP")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="--full: config overrides (KEY VALUE ...)")
    args = parser.parse_args(argv)
    if args.check:
        met, message = check_class(args.csv, cpu_class())
        print(message)
        sys.exit(0 if met else 1)
    if args.full and args.lever:
        parser.error("--full and --lever are separate measurements: give one")
    if args.full:
        return main_full(args)
    if args.iters <= args.skip:
        parser.error("--iters must be larger than --skip")
    if args.lever:
        try:
            levers = [parse_lever(text) for text in args.lever]
        except ValueError as err:
            parser.error(str(err))
        if args.csv == DEMO_CSV:
            args.csv = LEVERS_CSV
        main_levers(args, levers)
        return None
    speedups, per_config = [], {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            round_times = {}
            for name, config in CONFIGS.items():
                round_dir = os.path.join(workdir, str(r))  # a fresh run each round
                round_times[name] = seconds_per_step(config, args.iters, args.skip, round_dir)
                per_config[name].append(round_times[name])
            speedups.append(round_times["main job"] / round_times["demo"])
            print(
                f"round {r + 1}: main job {round_times['main job']:.3f} s/step, demo "
                f"{round_times['demo']:.3f} s/step, speed-up {speedups[-1]:.2f}x",
                flush=True,
            )
    for name, values in per_config.items():
        print(f"{name}: {min(values):.3f}-{max(values):.3f} s/step (median {statistics.median(values):.3f})")
    print(f"speed-up (main job / demo): {min(speedups):.2f}-{max(speedups):.2f}x "
          f"over {args.rounds} rounds (median {statistics.median(speedups):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
