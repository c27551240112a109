"""Atomic checkpoints and the resumable data stream."""

import itertools
import os

import pytest
import torch
from torch import nn

import largedet  # noqa: F401
from largedet.engine import AtomicCheckpointer, ResumableTrainingSampler
from largedet.engine import checkpoint as checkpoint_module


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
