"""The multigrid batch sampler: shapes and batch sizes over a short cycle, stage
selection by epoch, DistributedSampler-style sharding, resume mid-epoch."""

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from largedet_video.multigrid import MultigridBatchSampler, build_multigrid_schedule


@pytest.fixture
def schedule():
    # B=2, T=8, S=16, both cycles; stage ends 18, 27, 35, 39, 42 (see
    # test_multigrid_schedule.test_both_cycles_epochs_and_lr). Per-device
    # short cycles: stage 0: 32x2x8, 16x2x11, 16x2x11; stage 1: 16x4x8, 8x4x11,
    # 8x4x11; fine-tuning (epochs 39-41): 8x8x8, 4x8x11, 2x8x16.
    return build_multigrid_schedule(2, 8, 16, [0, 23], 28)


def layout(batches):
    return [(len(b), b[0][1].num_frames, b[0][1].crop_size) for b in batches]


def test_short_cycle_shapes_and_batch_sizes(schedule):
    sampler = MultigridBatchSampler(200, schedule, seed=0, rank=0, world_size=1)
    batches = list(sampler)
    # 200 clips, cycle of 32 + 16 + 16 = 64: 3 full cycles (192, 9 batches),
    # then 8 left < 32: dropped.
    assert layout(batches) == [(32, 2, 8), (16, 2, 11), (16, 2, 11)] * 3
    assert len(sampler) == 9
    for batch in batches:
        assert len({shape for _, shape in batch}) == 1
    indices = [i for b in batches for i, _ in b]
    assert len(set(indices)) == 192 and set(indices) <= set(range(200))


def test_last_short_batch_kept_without_drop_last(schedule):
    sampler = MultigridBatchSampler(200, schedule, seed=0, rank=0, world_size=1, drop_last=False)
    batches = list(sampler)
    # The 8 clips left after 9 batches form a 10th batch, at the next shape in
    # the cycle (the first, 2x8).
    assert len(batches) == len(sampler) == 10
    assert layout(batches)[-1] == (8, 2, 8)
    assert sorted(i for b in batches for i, _ in b) == list(range(200))


def test_set_epoch_selects_stage(schedule):
    sampler = MultigridBatchSampler(200, schedule, seed=0, rank=0, world_size=1)
    sampler.set_epoch(18)
    # Stage 1, cycle 16 + 8 + 8 = 32: 6 cycles (192, 18 batches), 8 left < 16.
    assert sampler.stage.index == 1
    assert layout(list(sampler))[:3] == [(16, 4, 8), (8, 4, 11), (8, 4, 11)]
    assert len(sampler) == 18
    sampler.set_epoch(41)
    # Fine-tuning, cycle 8 + 4 + 2 = 14: 14 cycles (196, 42 batches), 4 left < 8.
    assert sampler.stage.fine_tuning
    assert layout(list(sampler))[:3] == [(8, 8, 8), (4, 8, 11), (2, 8, 16)]
    assert len(sampler) == 42
    with pytest.raises(ValueError):
        sampler.set_epoch(42)


def test_len_matches_iteration_in_every_stage(schedule):
    for drop_last, world_size in itertools.product([True, False], [1, 3]):
        sampler = MultigridBatchSampler(
            101, schedule, seed=1, rank=world_size - 1, world_size=world_size, drop_last=drop_last
        )
        for stage in schedule.stages:
            sampler.set_epoch(stage.start_epoch)
            assert len(list(sampler)) == len(sampler) == sampler.num_batches(stage)
    # Whole schedule with one rank, 101 clips, drop_last: stage 0: cycle 64, one
    # cycle (3 batches), 37 left = 32 + 5 -> 4 batches x 18 epochs; stage 1: cycle
    # 32, 3 cycles (9), 5 left -> 9 x 9; stage 2: cycle 16 + 8 + 4 = 28, 3 cycles
    # (9), 17 left = 16 + 1 -> 10 x 8; stage 3 and fine-tuning: cycle 14, 7 cycles
    # (21), 3 left -> 21 x (4 + 3).
    sampler = MultigridBatchSampler(101, schedule, seed=1, rank=0, world_size=1)
    assert sampler.total_iterations() == 4 * 18 + 9 * 9 + 10 * 8 + 21 * 7


def test_shards_like_distributed_sampler():
    # No cycles, B=4: one shape 4x8x16. 100 clips on 3 ranks: 34 each (2 wrapped).
    sched = build_multigrid_schedule(4, 8, 16, [0, 4], 6, long_cycle=False, short_cycle=False)
    for epoch in (0, 3):
        per_rank = []
        for rank in range(3):
            sampler = MultigridBatchSampler(
                100, sched, seed=7, rank=rank, world_size=3, drop_last=False
            )
            sampler.set_epoch(epoch)
            reference = DistributedSampler(
                range(100), num_replicas=3, rank=rank, shuffle=True, seed=7
            )
            reference.set_epoch(epoch)
            batches = list(sampler)
            # 34 = 8 batches of 4 + one of 2.
            assert [len(b) for b in batches] == [4] * 8 + [2]
            per_rank.append([i for b in batches for i, _ in b])
            assert per_rank[-1] == list(reference)
        assert set().union(*per_rank) == set(range(100))


def test_reshuffles_per_epoch_and_is_deterministic(schedule):
    sampler = MultigridBatchSampler(200, schedule, seed=3, rank=0, world_size=1)
    first = [i for b in sampler for i, _ in b]
    assert first == [i for b in sampler for i, _ in b]
    sampler.set_epoch(1)
    assert first != [i for b in sampler for i, _ in b]
    sampler.set_epoch(0)
    assert first == [i for b in sampler for i, _ in b]
    unshuffled = MultigridBatchSampler(200, schedule, shuffle=False, rank=0, world_size=1)
    assert [i for b in unshuffled for i, _ in b] == list(range(192))


def test_resume_mid_epoch_keeps_clips_and_cycle_position(schedule):
    sampler = MultigridBatchSampler(200, schedule, seed=0, rank=0, world_size=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start_iteration=4)
    resumed = list(sampler)
    # Batch 4 is at cycle position 4 % 3 = 1 (16x2x11).
    assert resumed == full[4:]
    assert len(sampler) == 9 - 4
    assert sampler.shape_at(4) == full[4][0][1]
    with pytest.raises(ValueError):
        sampler.set_epoch(2, start_iteration=10)


class _ShapeEcho(Dataset):
    """Returns a zero clip (t, 3, s, s) of the requested shape."""

    def __len__(self):
        return 50

    def __getitem__(self, item):
        index, shape = item
        return torch.zeros(shape.num_frames, 3, shape.crop_size, shape.crop_size), index


def test_dataloader_gets_the_shape(schedule):
    sampler = MultigridBatchSampler(50, schedule, seed=0, rank=0, world_size=1)
    sampler.set_epoch(39)
    loader = DataLoader(_ShapeEcho(), batch_sampler=sampler)
    clips = [clip.shape for clip, _ in loader]
    # 50 clips, cycle 14: 3 cycles (42, 9 batches), 8 left: one more 8x8x8 batch.
    assert clips == [(8, 8, 3, 8, 8), (4, 8, 3, 11, 11), (2, 8, 3, 16, 16)] * 3 + [(8, 8, 3, 8, 8)]
