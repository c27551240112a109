"""Shared by the tests of the launchers' pre-launch errors (tools/train_net.py and the video
project's train.py): run a command that must be refused, and read its error lines."""

import re
import subprocess
import sys
import time


def error_lines(stderr):
    """``stderr`` without Python's warnings: a ``file:line: XWarning: ...`` line and the
    source line under it (torch deprecations printed when fvcore is imported)."""
    lines, after_warning = [], False
    for line in stderr.splitlines():
        if re.match(r"\S+:\d+: \w*Warning: ", line):
            after_warning = True
        elif not (after_warning and line.startswith("  ")):
            after_warning = False
            lines.append(line)
    return lines


def run_rejected(script, args, env, untouched):
    """Run ``script`` with ``args``; it must stop with one ``error:`` line and exit 2 within
    two minutes (imports only: no model built, no process spawned), having created none of
    the ``untouched`` paths (the dataset caches it would generate). Returns that line."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=300
    )
    lines = error_lines(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert time.monotonic() - start < 120
    assert not any(path.exists() for path in untouched), untouched
    return lines[0]


def dead_pid() -> int:
    """The PID of a process that has ended and been reaped: spawned and waited for here,
    so no process of this machine holds it (unless the kernel hands it out again, which it
    does only after cycling through the other free PIDs)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid
