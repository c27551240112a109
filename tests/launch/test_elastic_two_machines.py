"""Two "machines" on one host: an elastic torchrun job across two network namespaces.

The test makes two network namespaces joined by a veth pair (10.253.0.1/30 and
10.253.0.2/30, addresses that exist only inside them; gloo, the c10d rendezvous and the
agents' store talk over it, nothing else is reached), starts one torchrun agent in each
(``--nnodes 1:2``, c10d rendezvous hosted by the first), and trains a tiny shapes run, a
checkpoint every two steps. Mid-run the second machine is lost: its link goes down (nothing
it sends arrives any more, as when a machine loses power) and every process of its
namespace is killed. The survivor's collective fails within ``DISTRIBUTED.TIMEOUT_S``, its
worker exits 69, its agent restarts it on one process, which resumes from the newest
complete checkpoint with K doubled and finishes the run. Checked: every optimizer step
once in ``metrics.json``; the final weights equal, bit for bit, those of a one-process run
resumed from the same checkpoint (the layout the survivor trains on from the restart).
The time from the loss to the next optimizer step is printed. A second test has the lost
machine come back (its link up, its agent started again with the same command): the next
round trains on both machines to the end, every step once. The namespaces are removed at the
end, also on failure. Skipped where namespaces cannot be made (not root, no ``ip``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

from largedet.launch.elastic import LOST_PROCESS_EXIT_CODE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
SUBNET = "10.253.0.{}"
RDZV_PORT = 29400
MAX_ITER = 10
TIMEOUT_S = 10  # DISTRIBUTED.TIMEOUT_S of the run

pytestmark = pytest.mark.elastic


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class TwoMachines:
    """Two network namespaces joined by a veth pair; :meth:`remove` ends their processes
    and deletes them."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.names = (f"ldel{tag}a", f"ldel{tag}b")
        self.links = (f"ldv{tag}a", f"ldv{tag}b")
        self.addresses = (SUBNET.format(1), SUBNET.format(2))
        for name in self.names:
            _ip("netns", "add", name)
        _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
        for name, link, address in zip(self.names, self.links, self.addresses):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/30", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def pids(self, machine: int):
        out = _ip("netns", "pids", self.names[machine], check=False).stdout
        return [int(p) for p in out.split()]

    def kill(self, machine: int) -> None:
        """Every process of the namespace, by its pids, until none is left."""
        for _ in range(50):
            pids = self.pids(machine)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def remove(self) -> None:
        for machine, name in enumerate(self.names):
            self.kill(machine)
            _ip("netns", "del", name, check=False)


@pytest.fixture
def two_machines():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    probe = f"ldelprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    _ip("netns", "del", probe, check=False)
    machines = None
    try:
        machines = TwoMachines()
        yield machines
    finally:
        if machines is not None:
            machines.remove()


def _overrides(spec, out):
    return [
        "DATASETS.SHAPES.ROOT", spec.root, "DATASETS.SHAPES.NUM_TRAIN", str(spec.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(spec.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(spec.image_size),
        "DATASETS.SHAPES.SEED", str(spec.seed), "DATASETS.TEST", "()",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "4",
        "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", str(MAX_ITER), "SOLVER.CHECKPOINT_PERIOD", "2",
        "SOLVER.WARMUP_ITERS", "2", "DATALOADER.NUM_WORKERS", "0", "DATALOADER.ASPECT_RATIO_GROUPING", "False",
        "SEED", "5", "RESEED_EVERY_ITER", "True", "LOG_PERIOD", "1", "DISTRIBUTED.TIMEOUT_S", str(TIMEOUT_S),
        "OUTPUT_DIR", str(out),
    ]  # fmt: skip


def _agent(machines, machine, overrides, log, imports=()):
    """One torchrun agent (one worker) in namespace ``machine``; the first hosts the c10d
    rendezvous. Each round's workers get a store of their own
    (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, docs/launching.md): with the agent's shared
    store, the round that admits a machine never publishes its ``MASTER_ADDR``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=machines.links[machine],
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # fmt: skip
    if imports:  # modules of this folder, for --import
        env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [
        "ip", "netns", "exec", machines.names[machine],
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{machines.addresses[0]}:{RDZV_PORT}",
        "--rdzv-id", "elastic-test", "--rdzv-conf", f"join_timeout=120,last_call_timeout=3,is_host={int(machine == 0)}",
        "--local-addr", machines.addresses[machine], "--max-restarts", "2", "--monitor-interval", "0.5",
        TRAIN_NET, *(a for name in imports for a in ("--import", name)), "--config", CONFIG, *overrides,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _records(out):
    path = out / "metrics.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _invocations(out):
    try:
        return json.loads((out / "run_summary.json").read_text())["invocations"]
    except (OSError, ValueError, KeyError):
        return []


def _wait(condition, timeout, what, *procs):
    deadline = time.monotonic() + timeout
    while not condition():
        for proc, log in procs:
            assert proc.poll() is None, f"{what}: an agent ended early:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def _model(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_elastic_job_loses_a_machine_and_the_survivor_finishes(two_machines, tiny_shapes, tmp_path):
    out = tmp_path / "run"
    overrides = _overrides(tiny_shapes, out)
    logs = [tmp_path / "machine0.log", tmp_path / "machine1.log"]
    # the second first: it waits for the first's rendezvous store, so both join round 0
    with open(logs[1], "w") as log1, open(logs[0], "w") as log0:
        second = _agent(two_machines, 1, overrides, log1)
        first = _agent(two_machines, 0, overrides, log0)
        procs = [(first, logs[0]), (second, logs[1])]
        try:
            # a round on both machines (rank 1's log) that has trained a few steps
            _wait(lambda: (out / "log.txt.rank1").exists() and len(_records(out)) >= 4,
                  240, "two machines training", *procs)  # fmt: skip
            # the second machine is lost: its link goes down, then all its processes die
            _ip("-n", two_machines.names[1], "link", "set", two_machines.links[1], "down")
            two_machines.kill(1)
            lost_at = time.monotonic()
            second.wait(timeout=30)

            # when the survivor's worker said so, its agent saw it exit, and the restarted
            # worker started training (seconds after the loss)
            marks = {"exit line": f"exiting with {LOST_PROCESS_EXIT_CODE}",
                     "agent saw the exit": f"(exitcode: {LOST_PROCESS_EXIT_CODE})"}  # fmt: skip
            seen = {}

            def resumed_step():
                text = logs[0].read_text()
                for name, mark in marks.items():
                    if name not in seen and mark in text:
                        seen[name] = time.monotonic() - lost_at
                if "training restarted" not in seen and (out / "log.txt").read_text().count("Starting training") > 1:
                    seen["training restarted"] = time.monotonic() - lost_at
                runs = _invocations(out)
                # "finished": the survivor's few steps may all fall between two looks
                return len(runs) >= 2 and any(r["iteration"] >= runs[-1]["start_iter"] for r in _records(out)
                                              if r.get("iteration") is not None) and runs[-1]["status"] in ("running", "finished")  # fmt: skip

            _wait(resumed_step, 180, "the survivor training again", procs[0])
            seconds = time.monotonic() - lost_at
            stages = ", ".join(f"{name} {t:.1f} s" for name, t in seen.items())
            print(f"\nfrom the loss of a machine to the next optimizer step: {seconds:.1f} s "
                  f"({stages}; DISTRIBUTED.TIMEOUT_S {TIMEOUT_S})")  # fmt: skip
            assert first.wait(timeout=240) == 0, logs[0].read_text()[-4000:]
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
    text = logs[0].read_text()
    assert f"exiting with {LOST_PROCESS_EXIT_CODE}" in text, text[-4000:]
    iterations = [r["iteration"] for r in _records(out) if "total_loss" in r]
    assert iterations == list(range(MAX_ITER)), iterations
    runs = _invocations(out)
    start = runs[-1]["start_iter"]
    assert runs[-1]["status"] == "finished" and 0 < start < MAX_ITER, runs
    log = (out / "log.txt").read_text()
    assert "Resuming on 1 process(es) x 2 image(s) per pass x K = 2 (the checkpoint's run: 2 x 2 x K = 1)" in log

    # the survivor's layout (one process, K = 2) from the same checkpoint, uninterrupted
    reference = tmp_path / "reference"
    reference.mkdir()
    checkpoint = f"model_{start - 1:07d}.pth"
    shutil.copy(out / checkpoint, reference / checkpoint)
    (reference / "last_checkpoint").write_text(checkpoint)
    done = subprocess.run(
        [sys.executable, TRAIN_NET, "--config", CONFIG, "--resume", *_overrides(tiny_shapes, reference)],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    elastic, straight = _model(out / "model_final.pth"), _model(reference / "model_final.pth")
    assert elastic.keys() == straight.keys()
    for name in elastic:
        assert torch.equal(elastic[name], straight[name]), name


#: the rejoin run's length and an LR that stays finite for the whole run; the survivor
#: training alone holds after its second step until its agent stops it (holds.py), so
#: the machine is back before the run can end, however busy the host
REJOIN_MAX_ITER = 20
REJOIN_LR = "0.002"
HOLD = ("holds",)  # the module of this folder that gives the HoldWhileAlone hook


def test_a_lost_machine_rejoins_and_the_run_finishes_on_both(two_machines, tiny_shapes, tmp_path):
    """The second machine is lost, the survivor trains on alone; then the machine comes back
    (its link up, its agent started again with the same command): the survivor's agent sees it
    waiting and stops its worker with SIGTERM (it saves at the step's end), and the next round
    trains on both machines, K back to 1, to the end. Every step once in ``metrics.json``. The
    survivor's round holds after its second step until that SIGTERM (holds.py), so the machine
    is back before the run can end, however fast or slow the host."""
    out = tmp_path / "run"
    overrides = _overrides(tiny_shapes, out)
    overrides[overrides.index("SOLVER.MAX_ITER") + 1] = str(REJOIN_MAX_ITER)
    overrides += ["SOLVER.BASE_LR", REJOIN_LR, "HOOKS", "('HoldWhileAlone',)"]
    logs = [tmp_path / "machine0.log", tmp_path / "machine1.log", tmp_path / "machine1_again.log"]
    with open(logs[1], "w") as log1, open(logs[0], "w") as log0, open(logs[2], "w") as log2:
        second = _agent(two_machines, 1, overrides, log1, HOLD)
        first = _agent(two_machines, 0, overrides, log0, HOLD)
        procs = [(first, logs[0])]
        again = None
        try:
            _wait(lambda: (out / "log.txt.rank1").exists() and len(_records(out)) >= 4,
                  240, "two machines training", *procs, (second, logs[1]))  # fmt: skip
            _ip("-n", two_machines.names[1], "link", "set", two_machines.links[1], "down")
            two_machines.kill(1)
            second.wait(timeout=30)

            def training_alone():
                runs = _invocations(out)
                return len(runs) >= 2 and runs[-1]["status"] == "running" and any(
                    r["iteration"] >= runs[-1]["start_iter"] for r in _records(out) if "total_loss" in r)

            _wait(training_alone, 180, "the survivor training alone", *procs)
            alone_from = _invocations(out)[-1]["start_iter"]
            # the machine comes back
            _ip("-n", two_machines.names[1], "link", "set", two_machines.links[1], "up")
            back_at = time.monotonic()
            again = _agent(two_machines, 1, overrides, log2, HOLD)
            procs.append((again, logs[2]))

            def training_on_both():  # "finished": its few steps may all fall between two looks
                runs = _invocations(out)
                return len(runs) >= 3 and runs[-1]["status"] in ("running", "finished") and any(
                    r["iteration"] >= runs[-1]["start_iter"] for r in _records(out) if "total_loss" in r)

            _wait(training_on_both, 240, "training on both machines again", *procs)
            print(f"\nfrom the machine's agent starting again to the next optimizer step on both: "
                  f"{time.monotonic() - back_at:.1f} s")  # fmt: skip
            assert first.wait(timeout=300) == 0, logs[0].read_text()[-4000:]
            assert again.wait(timeout=60) == 0, logs[2].read_text()[-4000:]
        finally:
            for proc in (first, second, again):
                if proc is not None and proc.poll() is None:
                    proc.kill()
    iterations = [r["iteration"] for r in _records(out) if "total_loss" in r]
    assert iterations == list(range(REJOIN_MAX_ITER)), iterations
    runs = _invocations(out)
    assert len(runs) == 3 and runs[-1]["status"] == "finished", runs
    assert 0 < alone_from < runs[-1]["start_iter"] < REJOIN_MAX_ITER, runs
    log = (out / "log.txt").read_text()
    assert "Resuming on 1 process(es) x 2 image(s) per pass x K = 2 (the checkpoint's run: 2 x 2 x K = 1)" in log
    assert "Resuming on 2 process(es) x 2 image(s) per pass x K = 1 (the checkpoint's run: 1 x 2 x K = 2)" in log
    # the survivor's worker was stopped by its agent, at a step's end, with a checkpoint
    assert "(SIGTERM): checkpoint" in log, log[-4000:]
