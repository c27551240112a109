"""projects/video/benchmarks/throughput.py's decoding part on the CPU: it builds its own
16-video set and a Kinetics-sized clip and reports each decoder's clips/s for both (its
training part runs in tests/benchmarks/test_gpu_check.py's dry run)."""

import os
import re
import subprocess
import sys

VIDEO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(VIDEO_ROOT, "benchmarks", "throughput.py")


def test_decoding_part_reports_pyav_on_both_video_sets():
    cmd = [sys.executable, SCRIPT, "--decoders", "pyav", "--decode-seconds", "0.2"]
    cmd += ["--decode-rounds", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = re.findall(r"^\s+pyav\s+([\d.]+) clips/s", proc.stdout, re.M)
    assert len(rows) == 2 and all(float(r) > 0 for r in rows), proc.stdout
    assert "built-in moving shapes (16 videos" in proc.stdout
    assert "Kinetics-like" in proc.stdout
