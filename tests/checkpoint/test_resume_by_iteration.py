"""``--resume`` chooses by the iteration a checkpoint records, never by the files' modification
times; a save never writes over a checkpoint of a later iteration; and every checkpoint is read
with ``weights_only=True`` given explicitly, so that ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` in
the environment cannot let a planted file run code."""

import os
import subprocess
import sys

import pytest
import torch
from engine_testing import largedet_log
from test_checkpoint_and_data import linear_checkpointer, messages, resume, save_checkpoints
from test_checkpoint_faults import _Evil
from torch import nn

from largedet.checkpoint import AtomicCheckpointer, LaterCheckpointError, UnsafeWeightsError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PREDICT = os.path.join(ROOT, "tools", "predict.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


def _touch_newest(path):
    stamp = 1_900_000_000_000_000_000  # later than every other file of the folder
    os.utime(path, ns=(stamp, stamp))


@pytest.mark.parametrize("tag", ["model_0000005.pth", None])
def test_a_touched_older_checkpoint_is_not_resumed(tmp_path, tag):
    """A copy, an rsync or a restore from backup leaves an older checkpoint the newest file:
    the run still continues from the latest iteration, with or without the tag."""
    save_checkpoints(tmp_path)
    _touch_newest(tmp_path / "model_0000001.pth")
    if tag is None:
        os.remove(tmp_path / "last_checkpoint")
    assert resume(tmp_path) == (5, 5.0, "model_0000005.pth")


def test_of_two_checkpoints_at_one_iteration_the_tagged_one_is_resumed(tmp_path):
    save_checkpoints(tmp_path, (5,))
    linear_checkpointer(tmp_path, 7.0).save("model_final", iteration=5)
    (tmp_path / "last_checkpoint").write_text("model_0000005.pth")
    assert resume(tmp_path) == (5, 5.0, "model_0000005.pth")
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    assert resume(tmp_path) == (5, 7.0, "model_final.pth")


def test_a_save_never_writes_over_a_later_iteration(tmp_path):
    save_checkpoints(tmp_path, (5,))
    linear_checkpointer(tmp_path, 9.0).save("model_final", iteration=9)
    before = (tmp_path / "model_final.pth").read_bytes()
    with pytest.raises(LaterCheckpointError) as refused:
        linear_checkpointer(tmp_path, 6.0).save("model_final", iteration=6)
    assert str(refused.value).startswith(
        f"{tmp_path / 'model_final.pth'}: holds iteration 9, later than this run's 6: not writing over it"
    )
    assert "\n" not in str(refused.value)
    assert (tmp_path / "model_final.pth").read_bytes() == before
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"
    linear_checkpointer(tmp_path, 10.0).save("model_final", iteration=10)  # a later one replaces it
    assert resume(tmp_path) == (10, 10.0, "model_final.pth")


def _planted(path, marker):
    """A checkpoint file whose pickle creates ``marker`` when loaded without ``weights_only``."""
    state = linear_checkpointer(os.path.dirname(path), 9.0)
    data = {key: obj.state_dict() for key, obj in state.checkpointables.items()}
    torch.save({"model": state.model.state_dict(), **data, "iteration": 9, "payload": _Evil(marker)}, path)


def test_a_planted_checkpoint_runs_no_code_whatever_the_environment(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = str(tmp_path / "marker")
    save_checkpoints(tmp_path, (1, 3))
    _planted(str(tmp_path / "model_0000009.pth"), marker)
    with largedet_log(caplog):
        assert resume(tmp_path) == (3, 3.0, "model_0000003.pth")
    assert "skipped model_0000009.pth: does not load (UnsafeWeightsError: refusing to load" in messages(caplog)
    with pytest.raises(UnsafeWeightsError, match=r"^refusing to load .*model_0000009\.pth: it names the Python object"):
        AtomicCheckpointer(nn.Linear(3, 2)).load(str(tmp_path / "model_0000009.pth"))
    assert not os.path.exists(marker)


@pytest.mark.parametrize("resume_flag", [False, True])
def test_predict_refuses_a_planted_weights_file_in_one_line(tmp_path, resume_flag):
    """tools/predict.py under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: a planted MODEL.WEIGHTS, or
    a planted last checkpoint of OUTPUT_DIR with --resume, is one line, exit 2, no code run."""
    marker = str(tmp_path / "marker")
    out = tmp_path / "out"
    out.mkdir()
    planted = out / "model_final.pth"
    _planted(str(planted), marker)
    (out / "last_checkpoint").write_text("model_final.pth")
    where = ["--resume"] if resume_flag else ["MODEL.WEIGHTS", str(planted)]
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, PREDICT, "--config", CONFIG, "--input", CONFIG, *where,
                           "MODEL.DEVICE", "cpu", "OUTPUT_DIR", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert f"refusing to load {planted}: it names the Python object" in errors[0]
    assert "Traceback" not in proc.stderr and not os.path.exists(marker)
