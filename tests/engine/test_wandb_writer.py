"""The W&B event writer, in offline mode: the run file it leaves holds, step by step,
the same scalars as metrics.json; off by default, without importing wandb; a one-line
error naming the config key when wandb is missing."""

import glob
import itertools
import json
import os
import struct
import sys
import time
import zlib

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.engine import SimpleTrainer, default_writers, hooks
from detectron2.utils.events import EventStorage, JSONWriter

from largedet.config import add_largedet_config
from largedet.engine.writers import WandbWriter, build_wandb_writers


def _cfg(output_dir, **wandb):
    cfg = get_cfg()
    add_largedet_config(cfg)
    cfg.OUTPUT_DIR = str(output_dir)
    for key, value in wandb.items():
        setattr(cfg.WANDB, key, value)
    return cfg


def read_wandb_records(path):
    """The records of a ``.wandb`` run file, parsed with wandb's own protobuf.

    The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1,
    version), then 32 KiB blocks of chunks, each a 7-byte header (CRC-32 of the
    type byte and the data, length, type: 1 full, 2 first, 3 middle, 4 last)
    and its data; a block's tail shorter than a chunk header is padding."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 7:  # not even the header written yet
        return []
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk being written
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def offline_run_records(output_dir, timeout=30.0):
    """The records of the one offline run under ``output_dir``/wandb (the writer's
    log_dir, not $WANDB_DIR). wandb's service process writes the file on its own
    time, also after ``run.finish()`` has returned: wait for the run's last record."""
    (run_file,) = glob.glob(str(output_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, "the offline run file has no exit record"
        time.sleep(0.1)


def logged_history(records):
    """{step: {key: value}} of the run's history records, wandb's own keys left out."""
    logged = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            step = record.history.step.num
            logged[step] = {k: json.loads(v) for k, v in items.items() if not k.startswith("_")}
    return logged


def read_metrics_json(path):
    rows = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            rows[row.pop("iteration")] = row
    return rows


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_offline_run_holds_the_scalars_of_metrics_json(tmp_path, offline_wandb):
    out = tmp_path / "shapes_run"
    cfg = _cfg(out, ENABLED=True, PROJECT="largedet-test", MODE="offline")
    (writer,) = build_wandb_writers(cfg)
    assert isinstance(writer, WandbWriter) and writer.run.offline
    assert writer.run.name == "shapes_run"
    metrics = str(tmp_path / "metrics.json")
    writers = [writer, JSONWriter(metrics, window_size=20)]
    with EventStorage(start_iter=0) as storage:
        for it in range(40):
            storage.iter = it
            storage.put_scalars(total_loss=2.0 / (it + 1), loss_cls=1.0 / (it + 1))
            storage.put_scalar("lr", 0.001 * it, smoothing_hint=False)
            if it == 7:
                storage.put_scalar("agvm/mu/rpn", 1.25, smoothing_hint=False)
            if it == 39:  # the evaluation after the last step
                storage.put_scalar("bbox/AP", 63.2, smoothing_hint=False)
            if it in (19, 39):
                for w in writers:
                    w.write()
        for w in writers:
            w.write()  # nothing new: nothing written
            w.close()

    expected = read_metrics_json(metrics)
    assert sorted(expected) == [7, 19, 39] and expected[39]["bbox/AP"] == 63.2

    records = offline_run_records(out)
    assert logged_history(records) == expected
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "largedet-test" and run.display_name == "shapes_run"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["SOLVER"]["BASE_LR"] == cfg.SOLVER.BASE_LR
    assert config["WANDB"]["ENABLED"] is True


def test_periodic_writer_of_a_training_loop(tmp_path, offline_wandb):
    """Detectron2's writers plus this one, as ``build_writers`` returns them, in a
    training loop: the same scalars at the same iterations, the run closed at the end."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x):
            return {"loss_l2": (self.w * x).pow(2).sum()}

    model = Model()
    data = itertools.repeat(torch.tensor([1.0, -2.0]))
    trainer = SimpleTrainer(model, data, torch.optim.SGD(model.parameters(), lr=0.1))
    cfg = _cfg(tmp_path, ENABLED=True, MODE="offline")
    writers = default_writers(str(tmp_path), 5) + build_wandb_writers(cfg)
    trainer.register_hooks([hooks.IterationTimer(), hooks.PeriodicWriter(writers, period=2)])
    trainer.train(0, 5)

    expected = read_metrics_json(tmp_path / "metrics.json")
    assert sorted(expected) == [1, 3, 4] and "total_loss" in expected[4]
    # PeriodicWriter closes the writer after training: the run ends (its exit record).
    assert logged_history(offline_run_records(tmp_path)) == expected


def test_disabled_by_default_without_importing_wandb(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would fail
    cfg = _cfg(tmp_path)
    assert cfg.WANDB.ENABLED is False
    assert build_wandb_writers(cfg) == []


def test_missing_wandb_is_a_one_line_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError) as error:
        build_wandb_writers(_cfg(tmp_path, ENABLED=True))
    message = str(error.value)
    assert "WANDB.ENABLED" in message and "pip install wandb" in message
    assert "\n" not in message
    assert not os.path.exists(tmp_path / "wandb")
