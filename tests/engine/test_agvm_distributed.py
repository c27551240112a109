"""AGVM on two gloo processes: with K = 1 the two estimates are the two ranks' gradients,
with K = 2 the first and second micro-batch halves averaged over ranks; every rank ends
with the same mu, and the rank-halves path averages gradients as DDP does."""

import pytest
import torch
from engine_testing import max_abs_diff, run_on_two_processes, tiny_cfg, weights

import largedet  # noqa: F401
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from largedet.data import register_shapes
from largedet.engine import Trainer

AGVM_OPTS = [
    "SOLVER.AGVM.ENABLED", True,
    "SOLVER.AGVM.GROUPS", (("backbone", "conv"), ("backbone", "norm"), ("head", "head")),
    "SOLVER.AGVM.PERIOD", 1, "SOLVER.AGVM.START_ITER", 0, "SOLVER.AGVM.MOMENTUM", 0.5,
    "SOLVER.MAX_ITER", 2, "SOLVER.IMS_PER_DEVICE", 2,
]  # fmt: skip


def _local_grads(trainer):
    return [None if p.grad is None else p.grad.detach().clone() for p in trainer.agvm.params]


def _max_diff(xs, ys):
    return max(float((x - y).abs().max()) for x, y in zip(xs, ys))


def _run_k1(output_dir):
    """K = 1: check each estimate against the ranks' local gradients."""
    trainer = Trainer(tiny_cfg(output_dir, *AGVM_OPTS, "SOLVER.IMS_PER_BATCH", 4))
    inner, diffs = trainer.loop, []
    rank_halves = inner._rank_halves

    def checked():
        local = _local_grads(inner)  # computed in no_sync: this rank's own gradient
        every = comm.all_gather([g.cpu() for g in local])
        estimates = rank_halves()
        diffs.append(
            max(
                _max_diff([a for _, a, _ in estimates], every[0]),
                _max_diff([b for _, _, b in estimates], every[1]),
                _max_diff(
                    [p.grad for p in inner.agvm.params], [(x + y) / 2 for x, y in zip(*every)]
                ),
            )
        )
        return estimates

    inner._rank_halves = checked
    trainer.train()
    return trainer, diffs


def _run_k2(output_dir):
    """K = 2: g_A is the ranks' mean first micro-batch gradient, g_A + g_B the step's gradient."""
    trainer = Trainer(tiny_cfg(output_dir, *AGVM_OPTS, "SOLVER.IMS_PER_BATCH", 8))
    inner, diffs = trainer.loop, []
    halves, update = inner._micro_batch_halves, inner.agvm.update

    def checked_halves(first_half):
        every = comm.all_gather([g.cpu() for g in first_half])
        estimates = halves(first_half)
        mean = [(x + y) / 2 for x, y in zip(*every)]
        diffs.append(_max_diff([a for _, a, _ in estimates], mean))
        return estimates

    def checked_update(estimates):
        diffs.append(_max_diff([a + b for _, a, b in estimates], [p.grad for p, _, _ in estimates]))
        return update(estimates)

    inner._micro_batch_halves = checked_halves
    inner.agvm.update = checked_update
    trainer.train()
    return trainer, diffs


def _two_process_run(spec, output_dir, result_file):
    register_shapes(spec, prefix="tiny_shapes")
    results = {}
    for name, run in (("k1", _run_k1), ("k2", _run_k2)):
        seed_all_rng(0)
        trainer, diffs = run(f"{output_dir}/{name}")
        results[name] = {
            "accumulation": trainer.plan.batch.accumulation,
            "diffs": diffs,
            "mu_per_rank": comm.all_gather(trainer.loop.agvm.mu),
            "phi": trainer.loop.agvm.phi,
        }
    # the rank-halves path (no_sync, then this trainer's all-reduce) averages as DDP does
    for name, extra in (
        ("off", ["SOLVER.AGVM.ENABLED", False]),
        ("frozen_mu", ["SOLVER.AGVM.CLAMP", (1.0, 1.0)]),
    ):
        seed_all_rng(0)
        trainer = Trainer(
            tiny_cfg(f"{output_dir}/{name}", *AGVM_OPTS, "SOLVER.IMS_PER_BATCH", 4, *extra)
        )
        trainer.train()
        results[name] = weights(trainer.model)
    if comm.is_main_process():
        torch.save(results, result_file)


@pytest.fixture(scope="module")
def result(tiny_shapes, tmp_path_factory):
    return run_on_two_processes(_two_process_run, tiny_shapes, tmp_path_factory.mktemp("agvm_ddp"))


def test_k1_estimates_are_the_two_ranks_gradients(result):
    assert result["k1"]["accumulation"] == 1
    assert len(result["k1"]["diffs"]) == 2 and max(result["k1"]["diffs"]) < 1e-6


def test_k2_estimates_are_the_micro_batch_halves_averaged_over_ranks(result):
    assert result["k2"]["accumulation"] == 2
    assert len(result["k2"]["diffs"]) == 4 and max(result["k2"]["diffs"]) < 1e-6


@pytest.mark.parametrize("k", ["k1", "k2"])
def test_every_rank_has_the_same_mu(result, k):
    first, second = result[k]["mu_per_rank"]
    assert (
        first == second and first["head"] != 1.0 and set(result[k]["phi"]) == {"backbone", "head"}
    )


def test_rank_halves_average_gradients_as_ddp_does(result):
    assert max_abs_diff(result["off"], result["frozen_mu"]) < 1e-6
