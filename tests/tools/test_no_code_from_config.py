"""No entry point runs code from a config file: every script and console command that takes
``--config`` / ``--config-file`` (found by ``tests/tools/config_entry_points.py`` from the
scripts' own parsers) refuses a ``!!python/...`` tag, in the file or in its ``_BASE_``, in one
line naming the file, with a non-zero exit status, before the tag could run its command."""

import json
import os
import subprocess
import sys

import pytest

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_entry_points.py")


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("entry_points")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, PROBE, str(work_dir)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(work_dir / "observed.json") as f:
        return json.load(f)


def test_the_entry_points_that_take_a_config_are_found(observed):
    assert observed["failed_to_start"] == {}
    # the scripts and commands known to read a config are among those found, and no more
    # than those that have such a flag
    assert {
        "tools/train_net.py", "tools/lazyconfig_train_net.py", "tools/predict.py",
        "tools/visualize_json_results.py", "tools/submit.py", "projects/video/train.py",
        "console:largedet-train", "console:largedet-video-train",
    } <= set(observed["takes_config"])  # fmt: skip
    assert "tools/coco_eval.py" not in observed["takes_config"]
    assert len(observed["runs"]) == 2 * len(observed["takes_config"])


def test_no_entry_point_runs_a_tagged_config(observed):
    failures = []
    for name, run in observed["runs"].items():
        lines = [line for line in run["stderr"].splitlines() if line.strip()]
        expected = f"error: {run['tagged']}: refusing the tag !!python/object/apply:os.system (line 2): "
        refused = [line for line in lines if "refusing the tag" in line]
        ok = (
            not run["marker_created"]
            and run["exit"] == 2
            and not run["raised"]
            and "Traceback" not in run["stderr"]
            and len(refused) == 1
            and lines[-1].startswith(expected)
        )
        if not ok:
            failures.append(
                f"{name}: exit {run['exit']}, marker {run['marker_created']}, "
                f"stderr {run['stderr'][-500:]!r}{run['raised'][-1500:]}"
            )
    assert not failures, "\n".join(failures)
