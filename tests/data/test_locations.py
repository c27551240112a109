"""Data locations: the dataset and cache roots; build_once, concurrent and interrupted."""

import multiprocessing
import os
import threading
import time

import pytest

from largedet.data import ShapesSpec, build_once, cache_root, datasets_root
from largedet.data.openimages import default_cache_dir, default_openimages_root
from largedet.data.openimages.fixture import default_fixture_root


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_variables_give_the_defaults(monkeypatch, tmp_path, value):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("LARGEDET_DATASETS", "LARGEDET_CACHE"):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    datasets = str(tmp_path / ".cache" / "largedet" / "datasets")
    assert datasets_root() == datasets
    assert cache_root() == str(tmp_path / ".cache" / "largedet")
    # Every user of the roots agrees.
    assert os.path.dirname(ShapesSpec().directory) == datasets
    assert default_openimages_root() == os.path.join(datasets, "openimages")
    assert default_fixture_root() == os.path.join(datasets, "openimages_fixture")
    assert default_cache_dir() == str(tmp_path / ".cache" / "largedet" / "openimages")


def test_variables_are_read_on_each_call_and_expand_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LARGEDET_DATASETS", "~/data")
    monkeypatch.setenv("LARGEDET_CACHE", str(tmp_path / "cache"))
    assert datasets_root() == str(tmp_path / "data")
    assert os.path.dirname(ShapesSpec().directory) == str(tmp_path / "data")
    assert default_cache_dir() == str(tmp_path / "cache" / "openimages")
    monkeypatch.setenv("LARGEDET_DATASETS", "/elsewhere")
    assert default_openimages_root() == "/elsewhere/openimages"


def _slow_build(log, folder):
    """Record the call in ``log``, then write two files with a pause between them."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {threading.get_ident()}\n")
    with open(os.path.join(folder, "first.txt"), "w") as f:
        f.write("1")
    time.sleep(0.3)
    with open(os.path.join(folder, "last.txt"), "w") as f:
        f.write("done")


def _build_and_read(target, log, barrier):
    barrier.wait()
    assert build_once(target, lambda folder: _slow_build(log, folder)) == target
    with open(os.path.join(target, "first.txt")) as a, open(os.path.join(target, "last.txt")) as b:
        return a.read() + b.read()


def _process_main(target, log, barrier):
    os._exit(0 if _build_and_read(target, log, barrier) == "1done" else 3)


def test_concurrent_processes_build_once_and_all_see_the_whole_folder(tmp_path):
    target, log = str(tmp_path / "data" / "built"), str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    workers = [
        context.Process(target=_process_main, args=(target, log, barrier)) for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    with open(log) as f:
        assert len(f.readlines()) == 1
    # Nothing beside the target: no temporary folder, no lock file.
    assert os.listdir(tmp_path / "data") == ["built"]


def test_concurrent_threads_build_once(tmp_path):
    target, log = str(tmp_path / "built"), str(tmp_path / "log")
    barrier = threading.Barrier(6)
    seen = []
    threads = [
        threading.Thread(target=lambda: seen.append(_build_and_read(target, log, barrier)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == ["1done"] * 6
    with open(log) as f:
        assert len(f.readlines()) == 1


def test_an_interrupted_build_leaves_nothing_and_the_next_call_builds(tmp_path):
    target = str(tmp_path / "built")

    def interrupted(folder):
        with open(os.path.join(folder, "first.txt"), "w") as f:
            f.write("1")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_once(target, interrupted)
    assert os.listdir(tmp_path) == []
    build_once(target, lambda folder: _slow_build(str(tmp_path / "log"), folder))
    assert sorted(os.listdir(target)) == ["first.txt", "last.txt"]


def _killed_main(target):
    def killed(folder):
        with open(os.path.join(folder, "first.txt"), "w") as f:
            f.write("1")
        os._exit(9)  # no clean-up, as on SIGKILL or a power cut

    build_once(target, killed)


def test_a_killed_build_leaves_no_target_and_its_temporary_is_removed(tmp_path):
    target = str(tmp_path / "built")
    child = multiprocessing.get_context("fork").Process(target=_killed_main, args=(target,))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    left = os.listdir(tmp_path)
    assert "built" not in left and any(name.startswith(".tmp-built.") for name in left)
    # A build of another target whose name starts the same leaves it alone.
    build_once(str(tmp_path / "built.other"), lambda folder: _slow_build(os.devnull, folder))
    assert any(name.startswith(".tmp-built.") for name in os.listdir(tmp_path))
    build_once(target, lambda folder: _slow_build(os.devnull, folder))
    assert sorted(os.listdir(tmp_path)) == ["built", "built.other"]


def test_an_incomplete_target_is_an_error_and_an_empty_folder_is_replaced(tmp_path):
    target = tmp_path / "built"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    calls = []

    def is_complete(folder):
        return os.path.isfile(os.path.join(folder, "last.txt"))

    with pytest.raises(FileExistsError, match="built"):
        build_once(str(target), calls.append, is_complete=is_complete)
    assert calls == [] and (target / "mine.txt").read_text() == "keep"

    empty = tmp_path / "empty"
    empty.mkdir()
    build_once(str(empty), lambda folder: _slow_build(os.devnull, folder))
    assert sorted(os.listdir(empty)) == ["first.txt", "last.txt"]
    # Complete: not built again.
    build_once(str(empty), calls.append)
    assert calls == []
