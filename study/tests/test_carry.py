"""largedet_study.carry and the runners' ``--carry``: an interrupted cell's last checkpoint
travels to another machine's (empty) output folder and the cell resumes there."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from largedet_study import carry

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def write_run(run_dir, step=4, extra=()):
    """A run folder as the trainer leaves it when pre-empted at ``step``: two checkpoints (the
    last one named by ``last_checkpoint``), metrics, locks and an event file."""
    os.makedirs(run_dir, exist_ok=True)
    files = {
        "model_0000001.pth": b"old",
        f"model_{step:07d}.pth": f"weights at {step}".encode(),
        "last_checkpoint": f"model_{step:07d}.pth".encode(),
        "metrics.json": b'{"iteration": 1, "total_loss": 2.0}\n',
        "study_wall_clock_s": b"12.5\n",
        "run.lock": b"123",
        "study.lock": b"123",
        "events.out.tfevents.1.vm": b"tb",
        **dict(extra),
    }
    for name, data in files.items():
        with open(os.path.join(run_dir, name), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(run_dir, "inference"), exist_ok=True)


def test_save_keeps_the_last_checkpoint_and_records_only(tmp_path):
    run_dir, dest = str(tmp_path / "run"), str(tmp_path / "carry" / "cell")
    write_run(run_dir)
    assert carry.save(run_dir, dest)
    assert sorted(os.listdir(dest)) == [
        "last_checkpoint", "metrics.json", "model_0000004.pth", "study_wall_clock_s",
    ]  # fmt: skip
    assert open(os.path.join(dest, "model_0000004.pth"), "rb").read() == b"weights at 4"
    # a later save replaces the earlier one whole: no checkpoint of the earlier step stays
    write_run(run_dir, step=9)
    assert carry.save(run_dir, dest)
    assert "model_0000004.pth" not in os.listdir(dest) and "model_0000009.pth" in os.listdir(dest)
    assert sorted(os.listdir(tmp_path / "carry")) == ["cell"]  # no staging folder left


def test_nothing_is_saved_without_a_usable_checkpoint(tmp_path):
    run_dir, dest = tmp_path / "run", str(tmp_path / "carry" / "cell")
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text("{}\n")
    assert not carry.save(str(run_dir), dest) and not os.path.exists(dest)
    (run_dir / "last_checkpoint").write_text("model_0000004.pth")  # names a file that is gone
    assert not carry.save(str(run_dir), dest) and not os.path.exists(dest)


def test_restore_fills_an_empty_run_folder_and_never_overwrites_a_checkpoint(tmp_path):
    first, dest = str(tmp_path / "machine1"), str(tmp_path / "carry")
    write_run(first, step=4)
    carry.save(first, dest)
    fresh = str(tmp_path / "machine2")
    assert carry.restore(dest, fresh)
    assert open(os.path.join(fresh, "last_checkpoint")).read() == "model_0000004.pth"
    assert open(os.path.join(fresh, "model_0000004.pth"), "rb").read() == b"weights at 4"
    # a run folder further on than the carry keeps its own checkpoint
    ahead = str(tmp_path / "machine3")
    write_run(ahead, step=7)
    assert not carry.restore(dest, ahead)
    assert open(os.path.join(ahead, "last_checkpoint")).read() == "model_0000007.pth"
    assert not carry.restore(str(tmp_path / "nothing"), str(tmp_path / "machine4"))


# A stand-in for the trainer: a fresh run checkpoints step 4 and waits to be pre-empted; a
# resumed one reads its checkpoint, appends to metrics.json and finishes with an AP.
FAKE_TRAINER = r"""
import json, os, signal, sys, time
out = sys.argv[sys.argv.index("OUTPUT_DIR") + 1]
os.makedirs(out, exist_ok=True)
def write(name, text, mode="w"):
    with open(os.path.join(out, name), mode) as f:
        f.write(text)
if "--resume" in sys.argv:
    name = open(os.path.join(out, "last_checkpoint")).read().strip()
    step = int(open(os.path.join(out, name)).read())
    write("metrics.json", json.dumps({"iteration": step + 1, "total_loss": 1.0,
                                      "bbox/AP": 40.0 + step, "bbox/AP50": 60.0, "bbox/AP75": 30.0}) + "\n", "a")
    write("run_summary.json", json.dumps({"status": "finished", "invocations": [{"images_per_s": 8.0}]}))
    sys.exit(0)
write("metrics.json", json.dumps({"iteration": 4, "total_loss": 2.0}) + "\n")
write("model_0000004.pth", "4")
write("last_checkpoint", "model_0000004.pth")
write("ready", "")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
time.sleep(120)
"""

DRIVER = r"""
import sys
from largedet_study import runner
runner.TRAIN_COMMAND = (sys.executable, {fake!r})
runner.ensure_pretrained = lambda args: None
sys.exit(runner.main(sys.argv[1:]))
"""


def test_a_cell_interrupted_on_one_machine_finishes_on_another(tmp_path):
    fake = tmp_path / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)
    driver = DRIVER.format(fake=str(fake))
    carry_dir, csv_path, cell = tmp_path / "carry", tmp_path / "study.csv", "sgd-bs256"

    def study(output_dir):
        return [sys.executable, "-c", driver, "--grid", "short", "--only", cell, "--csv", str(csv_path),
                "--output-dir", str(output_dir), "--carry", str(carry_dir)]  # fmt: skip

    first = tmp_path / "machine1"
    proc = subprocess.Popen(study(first), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300  # the driver imports torch and Detectron2 first: slow on a busy machine
    while not (first / cell / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and f"last checkpoint carried to {carry_dir / cell}" in out
    assert sorted(os.listdir(carry_dir / cell)) == [
        "last_checkpoint", "metrics.json", "model_0000004.pth", "ready", "study_log.txt", "study_wall_clock_s",
    ]  # fmt: skip
    assert not csv_path.exists()

    second = tmp_path / "machine2"  # nothing of the first machine's output folder is here
    done = subprocess.run(study(second), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from the carried checkpoint in {carry_dir / cell}" in done.stdout
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [(r["cell"], r["box_ap"]) for r in rows] == [(cell, "44.00")]  # 40 + the carried step 4
    metrics = [json.loads(line) for line in open(second / cell / "metrics.json")]
    assert [m["iteration"] for m in metrics] == [4, 5]  # the first machine's records, then this one's
    # the wall clock goes on from the first machine's
    assert float(rows[0]["wall_clock_s"]) >= float(open(first / cell / "study_wall_clock_s").read())
    assert not (carry_dir / cell).exists()  # the finished cell's carry is gone



@pytest.mark.parametrize("carried", [True, False])
def test_the_backbone_is_pre_trained_only_for_a_cell_that_starts_from_step_0(tmp_path, monkeypatch, carried):
    from largedet_study import runner

    pretrained, weights = [], []

    def run_cell(plan, run_dir, args):
        weights.append(plan.overrides[plan.overrides.index("MODEL.WEIGHTS") + 1])
        return 1, "stopped", 1.0  # no row: only the start matters here

    monkeypatch.setattr(runner, "run_cell", run_cell)
    monkeypatch.setattr(runner, "ensure_pretrained", lambda args: pretrained.append(1) or runner.pretrained_path(args))
    cell, out, carry_dir = "sgd-bs16-wu0.65-lrx2-lrwsd-s2", tmp_path / "out", tmp_path / "carry"
    if carried:
        write_run(str(tmp_path / "elsewhere"), step=4)
        carry.save(str(tmp_path / "elsewhere"), str(carry_dir / cell))
    runner.main(["--grid", "regime", "--only", cell, "--output-dir", str(out), "--carry", str(carry_dir),
                 "--csv", str(tmp_path / "study.csv")])  # fmt: skip
    assert len(pretrained) == (0 if carried else 1)
    assert weights == [str(out / "pretrain" / "backbone.pth")]  # the same override either way
