"""study/study_gpu_cells.py's cells (:mod:`largedet_study.gpu_cells`): what it packs for a
machine that gives back few files, and the seconds per iteration it reads from a training
log."""

import os
import tarfile

import pytest

from largedet_study import gpu_cells


def make_run(root, cell, checkpoints, last, size):
    run = root / cell
    run.mkdir()
    for name in checkpoints:
        (run / name).write_bytes(b"x" * size)
    if last:
        (run / "last_checkpoint").write_text(last)
    (run / "metrics.json").write_text('{"iteration": 3}\n')
    (run / "events.out.tfevents.1.vm").write_bytes(b"e" * size)
    (run / "cell.lock").write_text("123")
    return run


def members(path):
    with tarfile.open(path) as tar:
        return sorted(tar.getnames())


def test_pack_keeps_only_the_last_checkpoint_and_bundles_under_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_cells, "PACK_LIMIT", 2500)
    out, dest = tmp_path / "out", tmp_path / "dest"
    out.mkdir()
    dest.mkdir()
    make_run(out, "a", ["model_0000010.pth", "model_0000020.pth"], "model_0000020.pth", 1000)
    make_run(out, "b", ["model_0000005.pth"], "model_0000005.pth", 1000)
    make_run(out, "c", ["model_0000007.pth"], "model_0000007.pth", 1000)
    make_run(out, "d", [], None, 1000)  # nothing saved yet: metadata only
    written = gpu_cells.pack_cells(str(out), ["a", "b", "c", "d", "missing"], str(dest), 7)
    assert [os.path.basename(w) for w in written] == ["cells_0.tar.gz", "cells_1.tar.gz"]
    # a and b (1000 + 1000 bytes and metadata) fill the first bundle, c does not fit there;
    # d's few bytes still do (first fit)
    assert members(written[0]) == [
        "a/last_checkpoint", "a/metrics.json", "a/model_0000020.pth",
        "b/last_checkpoint", "b/metrics.json", "b/model_0000005.pth", "d/metrics.json",
    ]  # fmt: skip
    assert members(written[1]) == ["c/last_checkpoint", "c/metrics.json", "c/model_0000007.pth"]


def test_pack_writes_no_more_files_than_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_cells, "PACK_LIMIT", 1500)
    out, dest = tmp_path / "out", tmp_path / "dest"
    out.mkdir()
    dest.mkdir()
    for cell in "abc":
        make_run(out, cell, ["model_final.pth"], "model_final.pth", 1000)
    written = gpu_cells.pack_cells(str(out), list("abc"), str(dest), 2)
    assert len(written) == 2 and sorted(os.listdir(dest)) == ["cells_0.tar.gz", "cells_1.tar.gz"]


def test_seconds_per_iteration_is_detectron2s_time_not_data_time(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(
        "[11/26 16:15:05] d2.utils.events INFO:  eta: 0:26:19  iter: 19  total_loss: 2.385"
        "    time: 1.4621  last_time: 1.3348  data_time: 0.2018  last_data_time: 0.1941\n"
        "[11/26 16:15:12] d2.utils.events INFO:  eta: 0:28:49  iter: 23  data_time: 0.1975"
        "  time: 1.4889  last_time: 1.6063\n"
        "[11/26 16:15:13] d2.engine.hooks INFO: Total training time: 0:00:07\n"
    )
    assert gpu_cells.seconds_per_iteration(str(log)) == 1.4889
    assert gpu_cells.seconds_per_iteration(str(tmp_path / "none.txt")) is None


def test_unpack_restores_what_pack_kept_where_a_resumed_study_looks(tmp_path):
    out, dest, fresh = tmp_path / "out", tmp_path / "dest", tmp_path / "fresh"
    for d in (out, dest, fresh):
        d.mkdir()
    make_run(out, "a", ["model_0000010.pth", "model_0000020.pth"], "model_0000020.pth", 100)
    make_run(out, "b", ["model_0000005.pth"], "model_0000005.pth", 100)
    gpu_cells.pack_cells(str(out), ["a", "b"], str(dest), 7)
    unpacked = gpu_cells.unpack_cells(str(dest), str(fresh))
    assert [os.path.basename(b) for b in unpacked] == ["cells_0.tar.gz"]
    assert sorted(os.listdir(fresh / "a")) == ["last_checkpoint", "metrics.json", "model_0000020.pth"]
    assert (fresh / "a" / "last_checkpoint").read_text() == "model_0000020.pth"
    assert (fresh / "b" / "model_0000005.pth").read_bytes() == b"x" * 100
    # a bundle whose member would leave the output folder is refused
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "cells_0.tar.gz", "w:gz") as tar:
        tar.add(str(out / "b" / "metrics.json"), arcname="../escaped.json")
    with pytest.raises(tarfile.TarError):
        gpu_cells.unpack_cells(str(bad), str(fresh))
    assert not (tmp_path / "escaped.json").exists()
