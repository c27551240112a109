"""Two faults a checkpoint meets: a crafted .pkl given as weights (refused before any of its
code runs, while Detectron2's model-zoo .pkl format still loads) and a full disk (one line
naming the file, the bytes needed and free; nothing lost)."""

import errno
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer
from engine_testing import largedet_log, tiny_cfg
from torch import nn

from largedet.checkpoint import AtomicCheckpointer, CheckpointSpaceError, UnsafeWeightsError
from largedet.checkpoint import atomic as ckpt
from largedet.engine import Trainer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


class _Evil:
    """Unpickling this creates the marker file (what a crafted weights file could do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_pkl(tmp_path):
    marker = str(tmp_path / "marker")
    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"w": np.zeros(2)}, "__author__": "x", "payload": _Evil(marker)}, f, protocol=2)
    return str(path), marker


def test_a_crafted_pkl_is_refused_before_its_code_runs(tmp_path):
    path, marker = _evil_pkl(tmp_path)
    with pytest.raises(UnsafeWeightsError) as e:
        AtomicCheckpointer(nn.Linear(2, 2)).load(path)
    assert str(e.value).startswith(f"refusing to load {path}: it names the Python object io.open")
    assert "\n" not in str(e.value) and not os.path.exists(marker)


def test_train_net_refuses_a_crafted_pkl_in_one_line_before_launch(tmp_path):
    path, marker = _evil_pkl(tmp_path)
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, "--eval-only", "MODEL.WEIGHTS", path,
                           "OUTPUT_DIR", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors == [
        f"error: MODEL.WEIGHTS: refusing to load {path}: it names the Python object io.open, which a "
        "model-zoo weights file never holds (only dicts, lists, tuples, strings, numbers and numpy "
        "arrays); loading it could run code"
    ], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not os.path.exists(marker)


def test_train_net_refuses_a_crafted_pth_in_one_line_before_launch(tmp_path):
    """A .pth whose pickle names a callable: refused while the config is checked, before any
    model is built, in one line without torch's advice to turn ``weights_only`` off."""
    marker = str(tmp_path / "marker")
    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "payload": _Evil(marker)}, path)
    good = tmp_path / "good.pth"
    torch.save({"model": nn.Linear(2, 2).state_dict()}, good)
    ckpt.check_torch_weights(str(good))  # a weights file passes
    with pytest.raises(UnsafeWeightsError, match=f"refusing to load {path}: it names the Python object"):
        ckpt.check_torch_weights(str(path))
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, "--eval-only", "MODEL.WEIGHTS", str(path),
                           "OUTPUT_DIR", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert errors[0].startswith(f"error: MODEL.WEIGHTS: refusing to load {path}: it names the Python object ")
    assert errors[0].endswith("which a weights file never holds; loading it could run code")
    assert "Traceback" not in proc.stderr and "weights_only" not in proc.stderr and "Building" not in proc.stderr
    assert not os.path.exists(marker)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)


@pytest.mark.parametrize("layout", ["detectron2", "caffe2_blobs", "caffe2_plain"])
def test_model_zoo_pkl_formats_still_load(tmp_path, layout):
    rng = np.random.default_rng(0)
    arrays = {"fc.weight": rng.standard_normal((2, 3)).astype(np.float32),
              "fc.bias": rng.standard_normal(2).astype(np.float32),
              "bn.weight": np.ones(2, np.float32), "bn.bias": np.zeros(2, np.float32),
              "bn.running_mean": rng.standard_normal(2).astype(np.float32),
              "bn.running_var": np.full(2, 2.0, np.float32)}  # fmt: skip
    if layout == "detectron2":
        data = {"model": arrays, "__author__": "Detectron2 Model Zoo", "epoch": np.int64(12)}
    elif layout == "caffe2_blobs":
        data = {"blobs": {**arrays, "fc.weight_momentum": np.zeros((2, 3), np.float32)}}
    else:
        data = dict(arrays)
    path = tmp_path / "weights.pkl"
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=2)  # Python 3's protocol 2 pickles bytes via _codecs.encode
    model, reference = Tiny(), Tiny()
    AtomicCheckpointer(model).load(str(path))
    DetectionCheckpointer(reference).load(str(path))  # Detectron2's own (unrestricted) reading
    ours, theirs = model.state_dict(), reference.state_dict()
    assert [k for k in theirs if not torch.equal(ours[k], theirs[k])] == []
    assert torch.equal(ours["fc.weight"], torch.from_numpy(arrays["fc.weight"]))
    if layout == "detectron2":  # names as they are: every array lands
        for name, array in arrays.items():
            assert torch.equal(ours[name], torch.from_numpy(array)), name


# --- a full disk -----------------------------------------------------------------------------


def test_a_full_disk_is_one_error_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, caplog):
    model = Tiny()
    checkpointer = AtomicCheckpointer(model, str(tmp_path))
    checkpointer.save("model_0000000")
    first = (tmp_path / "model_0000000.pth").read_bytes()
    size = len(first)
    assert checkpointer.last_size == size

    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        f.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(ckpt, "_free_bytes", lambda directory: 1234)
    with largedet_log(caplog):  # largedet's records reach caplog even once its logger is set up
        with pytest.raises(CheckpointSpaceError) as e:
            checkpointer.save("model_0000001")
    message = str(e.value)
    assert message == (
        f"{tmp_path / 'model_0000001.pth'}: no space left on the device: the checkpoint needs about "
        f"{size} bytes and 1234 are free; the previous checkpoint model_0000000.pth and last_checkpoint "
        "are unchanged"
    )
    assert e.value.__cause__ is None and e.value.__suppress_context__  # one traceback, not two
    assert f"has 1234 bytes free, less than checkpoint model_0000001.pth needs (about {size} bytes)" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000000.pth"]  # no temporary file
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000000.pth"
    monkeypatch.setattr(torch, "save", real_save)
    assert (tmp_path / "model_0000000.pth").read_bytes() == first
    AtomicCheckpointer(Tiny(), str(tmp_path)).resume_or_load("", resume=True)


def test_a_full_disk_stops_training_with_one_line(tiny_shapes, tmp_path, monkeypatch, capsys):
    from largedet.launch.processes import DISK_FULL_EXIT_CODE, _run_alone

    real_save = torch.save
    calls = []

    def second_save_fails(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", second_save_fails)
    monkeypatch.setattr(ckpt, "_free_bytes", lambda directory: 10)

    def main(args):
        trainer = Trainer(tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 4, "SOLVER.CHECKPOINT_PERIOD", 2))
        trainer.train()

    with pytest.raises(SystemExit) as stop:
        _run_alone(main, None)
    assert stop.value.code == DISK_FULL_EXIT_CODE
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model_0000003.pth: no space left on the device" in errors[0]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def test_an_output_dir_that_cannot_be_written_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("in the way")
    out = tmp_path / "file" / "run"
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, "OUTPUT_DIR", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors == [
        f"error: OUTPUT_DIR {str(out)!r} cannot be created or written: Not a directory"
    ], proc.stderr[-2000:]
