"""Atomic checkpoints, the resume that checks them, and the resumable data stream."""

import itertools
import os

import pytest
import torch
from engine_testing import largedet_log, tiny_cfg, weights
from launch_testing import dead_pid
from torch import nn

import largedet  # noqa: F401
from detectron2.utils.env import seed_all_rng
from largedet.checkpoint import AtomicCheckpointer, NoCompleteCheckpointError
from largedet.checkpoint import atomic as checkpoint_module
from largedet.data import ResumableTrainingSampler
from largedet.engine import Trainer


def test_checkpoint_and_tag_are_written_whole(tmp_path):
    model = nn.Linear(3, 2)
    checkpointer = AtomicCheckpointer(model, str(tmp_path))
    checkpointer.save("model_0000001", iteration=1)
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"
    assert torch.load(tmp_path / "model_0000001.pth")["iteration"] == 1
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000001.pth"]


def test_a_crash_while_writing_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch):
    model = nn.Linear(3, 2)
    checkpointer = AtomicCheckpointer(model, str(tmp_path))
    checkpointer.save("model_0000001", iteration=1)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        checkpointer.save("model_0000003", iteration=3)
    monkeypatch.undo()

    assert sorted(os.listdir(tmp_path)) == [
        "last_checkpoint",
        "model_0000001.pth",
    ]  # no partial file
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_0000001.pth")
    fresh = nn.Linear(3, 2)
    AtomicCheckpointer(fresh, str(tmp_path)).resume_or_load("", resume=True)
    assert all(torch.equal(fresh.state_dict()[k], good[k]) for k in good)


def test_the_tag_moves_only_after_the_file_is_in_place(tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace

    def recording_replace(src, dst):
        replaced.append(os.path.basename(dst))
        assert not os.path.basename(dst) == "last_checkpoint" or os.path.isfile(
            tmp_path / "model_final.pth"
        )
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", recording_replace)
    AtomicCheckpointer(nn.Linear(2, 2), str(tmp_path)).save("model_final")
    assert replaced == ["model_final.pth", "last_checkpoint"]


def linear_checkpointer(folder, value=0.0):
    """An ``nn.Linear(3, 2)`` whose weights are all ``value``, with an SGD optimizer and an
    LR scheduler as checkpointables, and its checkpointer on ``folder``."""
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
    return AtomicCheckpointer(model, str(folder), optimizer=optimizer, scheduler=scheduler)


def save_checkpoints(folder, iterations=(1, 3, 5)):
    """One checkpoint per iteration, each tagged in turn, weights = the iteration, the
    files' modification times one second apart in that order."""
    for k, it in enumerate(iterations):
        linear_checkpointer(folder, float(it)).save(f"model_{it:07d}", iteration=it)
        stamp = 1_700_000_000_000_000_000 + k * 1_000_000_000
        os.utime(folder / f"model_{it:07d}.pth", ns=(stamp, stamp))


def resume(folder):
    """(iteration, weight value, the file resumed from) of a fresh checkpointer's resume."""
    checkpointer = linear_checkpointer(folder, -1.0)
    extra = checkpointer.resume_or_load("", resume=True)
    value = checkpointer.model.weight.flatten()[0].item()
    return extra.get("iteration"), value, os.path.basename(checkpointer.resumed_from)


def messages(caplog):
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_truncated_newest_checkpoint_is_skipped_with_the_reason(tmp_path, caplog):
    save_checkpoints(tmp_path)
    newest = tmp_path / "model_0000005.pth"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with largedet_log(caplog):
        assert resume(tmp_path) == (3, 3.0, "model_0000003.pth")
    log = messages(caplog)
    assert "Resuming from " + str(tmp_path / "model_0000003.pth") in log
    assert "skipped model_0000005.pth: does not load (RuntimeError: " in log


@pytest.mark.parametrize(
    "tag, problem",
    [("", "last_checkpoint is empty"),
     ("model_0000009.pth", "last_checkpoint names model_0000009.pth, which does not exist")],
)  # fmt: skip
def test_an_empty_or_dangling_tag_resumes_from_the_newest_complete_checkpoint(
    tmp_path, caplog, tag, problem
):
    save_checkpoints(tmp_path)
    (tmp_path / "last_checkpoint").write_text(tag)
    with largedet_log(caplog):
        assert resume(tmp_path) == (5, 5.0, "model_0000005.pth")
    assert problem in messages(caplog)


def test_a_checkpoint_written_but_not_tagged_is_resumed(tmp_path, caplog):
    save_checkpoints(tmp_path)
    (tmp_path / "last_checkpoint").write_text("model_0000003.pth")  # killed before the tag moved
    with largedet_log(caplog):
        assert resume(tmp_path) == (5, 5.0, "model_0000005.pth")
    assert "names model_0000003.pth (iteration 3), but model_0000005.pth holds a later one (5;" in messages(caplog)
    os.remove(tmp_path / "last_checkpoint")  # killed before the first tag was ever written
    assert resume(tmp_path) == (5, 5.0, "model_0000005.pth")


def test_incomplete_checkpoints_are_skipped_and_weights_only_files_ignored(tmp_path, caplog):
    save_checkpoints(tmp_path, (1,))
    torch.save({"model": nn.Linear(3, 2).state_dict()}, tmp_path / "pretrained.pth")
    incomplete = linear_checkpointer(tmp_path, 7.0)
    del incomplete.checkpointables["scheduler"]
    incomplete.save("model_0000007", iteration=7)
    for k, name in enumerate(["pretrained.pth", "model_0000007.pth"]):
        stamp = 1_800_000_000_000_000_000 + k * 1_000_000_000  # all newer than model_0000001
        os.utime(tmp_path / name, ns=(stamp, stamp))
    with largedet_log(caplog):
        assert resume(tmp_path) == (1, 1.0, "model_0000001.pth")
    log = messages(caplog)
    assert "skipped model_0000007.pth: incomplete: no 'scheduler'" in log
    assert "pretrained.pth: it holds no training state" in log
    # weights only, no checkpoint: a fresh start from the given weights
    only_weights = tmp_path / "fresh"
    only_weights.mkdir()
    torch.save({"model": nn.Linear(3, 2).state_dict()}, only_weights / "R-50.pth")
    assert resume(only_weights) == (None, -1.0, "")


def test_without_a_complete_checkpoint_resume_fails_instead_of_starting_over(tmp_path):
    save_checkpoints(tmp_path, (1, 3))
    for name in ("model_0000001.pth", "model_0000003.pth"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(NoCompleteCheckpointError) as error:
        resume(tmp_path)
    assert "model_0000001.pth: does not load" in str(error.value)
    assert "model_0000003.pth: does not load" in str(error.value)
    for name in ("model_0000001.pth", "model_0000003.pth"):
        os.remove(tmp_path / name)
    with pytest.raises(NoCompleteCheckpointError, match="names model_0000003.pth, which does not"):
        resume(tmp_path)  # only the tag is left: its checkpoint is gone


def test_a_run_killed_between_checkpoint_and_tag_resumes_from_that_checkpoint(
    tiny_shapes, tmp_path, monkeypatch
):
    cfg = tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 4, "SOLVER.CHECKPOINT_PERIOD", 2)

    def killed(self, name):
        raise KeyboardInterrupt("killed after the weights were written, before the tag")

    seed_all_rng(0)
    first = Trainer(cfg)
    monkeypatch.setattr(AtomicCheckpointer, "tag_last_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    monkeypatch.undo()
    written = [n for n in os.listdir(tmp_path) if n.endswith(".pth") or "checkpoint" in n]
    assert written == ["model_0000001.pth"]  # no tag was ever written
    resumed = Trainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2  # not 0: the untagged checkpoint was used
    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=False)["model"]
    assert all(torch.equal(weights(resumed.model)[k], saved[k]) for k in saved)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_files_are_created_with_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        linear_checkpointer(tmp_path).save("model_0000001")
    finally:
        os.umask(previous)
    for name in ("model_0000001.pth", "last_checkpoint"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_temporary_files_of_a_killed_save_are_removed(tmp_path):
    pid = dead_pid()  # the killed save's process: no live process holds its PID
    stale = [f".model_0000003.pth.{pid}-0a1b2c3d.tmp", f".last_checkpoint.{pid}-0a1b2c3d.tmp",
             ".model_0000001.pth.k3_x9qz0.tmp"]  # fmt: skip
    for name in stale + [".notes.tmp"]:  # the last one is no checkpoint's: it stays
        (tmp_path / name).write_bytes(b"half")
    linear_checkpointer(tmp_path).save("model_0000005")
    assert sorted(os.listdir(tmp_path)) == [".notes.tmp", "last_checkpoint", "model_0000005.pth"]
    (tmp_path / stale[0]).write_bytes(b"half")
    linear_checkpointer(tmp_path).resume_or_load("", resume=True)
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == [".notes.tmp"]


def test_non_finite_weights_are_never_saved(tmp_path):
    checkpointer = linear_checkpointer(tmp_path, 1.0)
    checkpointer.save("model_0000001")
    with torch.no_grad():
        checkpointer.model.bias[1] = float("inf")
    with pytest.raises(FloatingPointError, match=r"0000003.pth: .* non-finite values in bias$"):
        checkpointer.save("model_0000003")
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000001.pth"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def global_stream(size, seed, n):
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        out += torch.randperm(size, generator=g).tolist()
    return out[:n]


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def as_rank(sampler, rank, world_size):
    """The sampler as rank ``rank`` of ``world_size`` would build it."""
    sampler._rank, sampler._world_size = rank, world_size
    return sampler


def test_sampler_position_skips_whole_global_stream_entries():
    stream = global_stream(size=10, seed=5, n=60)
    assert take(ResumableTrainingSampler(10, seed=5), 25) == stream[:25]
    assert take(ResumableTrainingSampler(10, seed=5, position=13), 20) == stream[13:33]
    # two ranks, 12 images consumed (e.g. 2 steps of global batch 6): rank r continues at 12 + r
    ranks = [as_rank(ResumableTrainingSampler(10, seed=5, position=12), r, 2) for r in range(2)]
    assert take(ranks[0], 5) == stream[12:22:2] and take(ranks[1], 5) == stream[13:23:2]
    # resumed on three ranks instead: together they still continue the same stream
    three = [as_rank(ResumableTrainingSampler(10, seed=5, position=12), r, 3) for r in range(3)]
    merged = [x for triple in zip(*(take(s, 4) for s in three)) for x in triple]
    assert merged == stream[12:24]


def test_sampler_seek_changes_position_and_seed():
    sampler = ResumableTrainingSampler(7, seed=1)
    sampler.seek(9, seed=2)
    assert (sampler.position, sampler.seed) == (9, 2)
    assert take(sampler, 6) == global_stream(7, 2, 15)[9:15]
    with pytest.raises(ValueError):
        sampler.seek(-1)
