"""Two gloo processes with accumulation equal one process with the same global batch,
DDP all-reduces once per optimizer step (counted with a communication hook), and the
processes exit cleanly."""

import atexit
import os

import pytest
import torch
from engine_testing import max_abs_diff, run_on_two_processes, tiny_cfg, weights
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import largedet  # noqa: F401
from detectron2.engine import HookBase
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from largedet.data import register_shapes
from largedet.engine import Trainer

# 3 optimizer steps of 12 images: two processes x 2 images x K = 3 micro-batches, or one
# process with one batch of 12
STEPS = 3
OPTS = ["SOLVER.IMS_PER_BATCH", 12, "SOLVER.MAX_ITER", STEPS, "SOLVER.MOMENTUM", 0.9]


class CountAllReduces(HookBase):
    """Gradient all-reduces (communication-hook calls, one per bucket) in each optimizer step."""

    def __init__(self, state):
        self.state = state
        self.per_step = []

    def after_step(self):
        self.per_step.append(self.state["calls"])
        self.state["calls"] = 0


def counting_allreduce(state, bucket):
    state["calls"] += 1
    return allreduce_hook(None, bucket)


def _two_process_run(spec, output_dir, result_file):
    register_shapes(spec, prefix="tiny_shapes")
    seed_all_rng(0)
    trainer = Trainer(tiny_cfg(output_dir, *OPTS, "SOLVER.IMS_PER_DEVICE", 2))
    state = {"calls": 0}
    trainer.model.register_comm_hook(state, counting_allreduce)
    counter = CountAllReduces(state)
    trainer.register_hooks([counter])
    trainer.train()
    per_rank = comm.all_gather(counter.per_step)
    if comm.is_main_process():
        torch.save(
            {
                "weights": weights(trainer.model),
                "all_reduces_per_step": per_rank,
                "accumulation": trainer.plan.batch.accumulation,
                "world_size": trainer.plan.batch.world_size,
                "data_seed": trainer.data.seed,
                "losses": trainer.loop.last_losses,
            },
            result_file,
        )


@pytest.fixture(scope="module")
def two_process_result(tiny_shapes, tmp_path_factory):
    return run_on_two_processes(_two_process_run, tiny_shapes, tmp_path_factory.mktemp("ddp"))


def test_two_processes_accumulate_three_micro_batches(two_process_result):
    assert (two_process_result["world_size"], two_process_result["accumulation"]) == (2, 3)


def test_one_all_reduce_per_optimizer_step(two_process_result):
    # without no_sync on the first K - 1 micro-batches this would be [3, 3, 3] on each rank
    assert two_process_result["all_reduces_per_step"] == [[1] * STEPS, [1] * STEPS]


def test_two_processes_equal_one_process_with_the_same_global_batch(two_process_result, tmp_path):
    seed_all_rng(0)
    single = Trainer(tiny_cfg(str(tmp_path), *OPTS))
    assert (single.plan.batch.world_size, single.plan.batch.accumulation, single.plan.batch.per_device) == (
        1,
        1,
        12,
    )
    assert single.data.seed == two_process_result["data_seed"]
    single.train()
    reference, distributed = weights(single.model), two_process_result["weights"]
    seed_all_rng(0)
    initial = weights(Trainer.build_model(tiny_cfg(str(tmp_path))))  # the weights before training
    assert max_abs_diff(reference, distributed) < 1e-6 < max_abs_diff(reference, initial)
    for name, value in single.loop.last_losses.items():
        assert two_process_result["losses"][name] == pytest.approx(value, abs=1e-6)


def _native_threads():
    tasks = sorted(os.listdir("/proc/self/task"), key=int)
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks]


def _write_threads_at_exit(path):
    with open(path, "w") as f:
        f.write("\n".join(_native_threads()))


def _train_then_exit(spec, output_dir, result_file):
    # registered before training, so it runs after the Trainer's exit handler (LIFO)
    atexit.register(_write_threads_at_exit, f"{result_file}.threads{comm.get_rank()}")
    register_shapes(spec, prefix="tiny_shapes")
    trainer = Trainer(tiny_cfg(output_dir, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 2))
    trainer.train()
    losses = comm.all_gather(trainer.loop.last_losses)  # a collective just before the exit
    if comm.is_main_process():
        torch.save({"losses": losses, "iter": trainer.iter}, result_file)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists threads from /proc")
def test_two_process_runs_exit_cleanly(tiny_shapes, tmp_path):
    # Without destroying the process groups (and the references Detectron2's comm keeps),
    # gloo's threads ran into interpreter finalization and, now and then, a worker aborted
    # with SIGABRT after training ("terminate called without an active exception").
    for run in range(3):
        out = tmp_path / f"run{run}"
        result = run_on_two_processes(_train_then_exit, tiny_shapes, out)  # raises on SIGABRT
        assert result["iter"] == 2 and result["losses"][0] == result["losses"][1]
        for rank in range(2):
            threads = (out / f"result.pth.threads{rank}").read_text().split("\n")
            # at exit, after the Trainer's handler: gloo's and the store's threads are joined
            assert [t for t in threads if "gloo" in t or "tcpstore" in t] == [], (run, rank)
