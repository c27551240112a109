"""Running the steps and recording them: each in its own process group under a time limit,
its log, its figures and status in ``results.json``, the summary table, the archive."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Tuple

from .environment import REPO
from .step import Step
from .steps import STEPS

#: seconds a dry-run step may take (on a busy 2-core CPU)
DRY_RUN_TIMEOUT_S = 300
#: with --budget, no step starts with less than this left
MIN_STEP_SECONDS = 60
#: seconds between SIGTERM and SIGKILL for a step past its limit
KILL_GRACE_S = 10


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_command(
    cmd: List[str], env: Dict[str, str], log_path: str, timeout: float
) -> Tuple[int, bool]:
    """Run ``cmd`` from the repository root with its output in ``log_path``; returns (exit
    code, whether it was stopped at ``timeout``). The command runs in a process group of its
    own, so that a stop also ends the processes it started (loader workers, say)."""
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _stop(proc)
            return proc.returncode, True
        except KeyboardInterrupt:
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def status_of(returncode: int, timed_out: bool, budget_stop: bool, missing: List[str]) -> str:
    if timed_out:
        return "interrupted" if budget_stop else "timeout"
    if returncode != 0:
        return "failed"
    return "incomplete" if missing else "passed"


def run_step(
    step: Step, args: argparse.Namespace, env, info, timeout: float, budget_stop: bool
) -> Dict[str, Any]:
    out_arg = os.path.relpath(args.output, REPO) if _inside(args.output, REPO) else args.output
    cmd = [sys.executable] + step.args(args.dry_run, out_arg)
    log_name = f"{step.name}.log"
    started = now()
    start = time.perf_counter()
    returncode, timed_out = run_command(cmd, env, os.path.join(args.output, log_name), timeout)
    wall = time.perf_counter() - start
    with open(os.path.join(args.output, log_name), errors="replace") as f:
        output = f.read()
    record: Dict[str, Any] = {
        "what": step.what,
        "command": ["python"] + cmd[1:],
        "command_line": shlex.join(["python"] + cmd[1:]),
        "exit_code": returncode,
        "wall_s": round(wall, 1),
        "timeout_s": round(timeout),
        "log": log_name,
        "date": started,
        "device": info.get("device"),
        "torch": info.get("torch"),
        "cuda": info.get("cuda"),
        "dry_run": args.dry_run,
    }
    try:
        figures = step.parse(output, args.output)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        figures = {}
        record["parse_error"] = f"{type(e).__name__}: {e}"
    required = step.required + (() if args.dry_run else step.required_on_gpu)
    missing = [key for key in required if key not in figures]
    record["figures"] = figures
    if missing:
        record["missing_figures"] = missing
    record["status"] = status_of(returncode, timed_out, budget_stop, missing)
    return record


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), root]) == root


def load_results(path: str, dry_run: bool) -> Dict[str, Any]:
    if not os.path.isfile(path):
        return {"steps": {}}
    with open(path) as f:
        results = json.load(f)
    if results.get("dry_run") != dry_run:
        kind = "a dry run" if results.get("dry_run") else "a GPU run"
        raise SystemExit(f"{path} holds {kind}: choose another --output")
    return results


def write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def summary_markdown(results: Dict[str, Any]) -> str:
    info = results.get("environment", {})
    dry_run = results.get("dry_run")
    if dry_run:
        title = "GPU check, dry run on the CPU (tiny sizes: the figures are not measurements)"
    else:
        title = f"GPU check on {info.get('device')}"
    if info.get("compiled_detectron2_ops"):
        detectron2 = "Detectron2 with its compiled ops"
    else:
        detectron2 = "Detectron2 without its compiled `_C`"
    lines = [
        f"### {title}",
        "",
        f"{results.get('updated', '')[:10]}; torch {info.get('torch')} (CUDA {info.get('cuda')}, "
        f"cuDNN {info.get('cudnn')}, NCCL {info.get('nccl')}), Python {info.get('python')}, "
        f"{info.get('cpu_count')} CPU cores; {detectron2}; timm "
        f"{info.get('versions', {}).get('timm')}. Command: `python benchmarks/gpu_check.py"
        f"{' --dry-run' if dry_run else ''}`; every step's command and log are in results.json.",
        "",
        "| step | status | wall | figures |",
        "| --- | --- | ---: | --- |",
    ]
    for step in STEPS:
        record = results["steps"].get(step.name)
        if record is None:
            lines.append(f"| {step.name}: {step.what} | not run | | |")
            continue
        try:
            figures = step.summarize(record["figures"]) if record["figures"] else ""
        except (KeyError, TypeError, ValueError):
            figures = ", ".join(sorted(record["figures"]))
        status = record["status"]
        if status == "incomplete":
            status += f" (not found: {', '.join(record['missing_figures'])})"
        lines.append(
            f"| {step.name}: {step.what} | {status} | {record['wall_s']:.0f} s | "
            f"{figures.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def archive(output: str, path: str) -> None:
    """The results, summary and logs (the output folder's files, not its sub-folders) in a
    .tar.gz, under the output folder's name."""
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for name in sorted(os.listdir(output)):
            full = os.path.join(output, name)
            if os.path.isfile(full) and not name.endswith(".tmp"):
                tar.add(
                    full, arcname=os.path.join(os.path.basename(os.path.normpath(output)), name)
                )
    os.replace(tmp, path)


def print_tail(path: str, lines: int = 25) -> None:
    with open(path, errors="replace") as f:
        tail = f.read().splitlines()[-lines:]
    print("\n".join("    | " + line for line in tail))
