"""largedet.launch.processes: the number of processes a job will have, and tools/train_net.py
under torchrun with two CPU processes (gloo): the config checked against torchrun's world
size before any training, then DDP training (the video project's train.py is tested so in
projects/video/tests/test_video_train.py)."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from largedet.engine import launched_by_torchrun, planned_world_size

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
TORCHRUN_2_CPU = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


def test_planned_world_size_is_torchruns_or_the_flags(monkeypatch):
    args = argparse.Namespace(num_gpus=4, num_machines=3)
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not launched_by_torchrun() and planned_world_size(args) == 12
    monkeypatch.setenv("WORLD_SIZE", "5")  # set by other launchers too: not torchrun's alone
    assert planned_world_size(args) == 12
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launched_by_torchrun() and planned_world_size(args) == 5


def torchrun_train_net(args, tmp_path, succeeds=True):
    """tools/train_net.py with ``args`` under torchrun, two processes on the CPU; returns
    stdout and stderr together."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               DETECTRON2_DATASETS=str(tmp_path / "d2"))  # fmt: skip
    proc = subprocess.run([sys.executable, *TORCHRUN_2_CPU, TRAIN_NET, "--config", CONFIG, *args],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == succeeds, output[-6000:]
    return output


def tiny_overrides(tiny_shapes, out_dir):
    return [
        "DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", str(tiny_shapes.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(tiny_shapes.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(tiny_shapes.image_size),
        "DATASETS.SHAPES.SEED", str(tiny_shapes.seed),
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "64",
        "INPUT.MAX_SIZE_TEST", "64", "SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "2",
        "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()", "DATALOADER.NUM_WORKERS", "0",
        "DATASETS.TEST", "()", "OUTPUT_DIR", str(out_dir),
    ]  # fmt: skip


def test_train_net_under_torchrun_trains_on_two_processes(tiny_shapes, tmp_path):
    out = tmp_path / "run"
    log = torchrun_train_net(tiny_overrides(tiny_shapes, out), tmp_path)
    assert "world size 2; global batch 4 (SOLVER.IMS_PER_BATCH); 2 image(s) per device" in log
    assert (out / "model_final.pth").is_file() and (out / "log.txt.rank1").is_file()
    with open(out / "metrics.json") as f:
        iterations = [json.loads(line)["iteration"] for line in f]
    assert iterations == [1]  # both steps, written once (LOG_PERIOD 20) by the main process


def test_train_net_under_torchrun_checks_the_batch_against_its_world_size(tiny_shapes, tmp_path):
    # 6 images split over --num-gpus 3, not over torchrun's 2 processes x 2: refused, and
    # --num-gpus named as ignored
    out = tmp_path / "refused"
    args = ["--num-gpus", "3", *tiny_overrides(tiny_shapes, out)]
    args += ["SOLVER.IMS_PER_BATCH", "6", "SOLVER.IMS_PER_DEVICE", "2"]
    log = torchrun_train_net(args, tmp_path, succeeds=False)
    lines = log.splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert warnings == [
        "warning: --num-gpus ignored under torchrun: the job has its 2 processes (2 on this "
        "machine, torchrun's --nproc_per_node and --nnodes)"
    ], log[-6000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, log[-6000:]  # both processes stop; the first one says why
    (error,) = errors
    assert error.startswith("error: SOLVER.IMS_PER_BATCH 6 is not a whole multiple of world size 2")
    assert "Starting training" not in log and not out.exists()


def test_process_flags_ignored_under_torchrun_are_found_from_their_values():
    from largedet.engine import largedet_argument_parser
    from largedet.launch.processes import process_flags_given as _process_flags_given

    parse = largedet_argument_parser().parse_args
    assert _process_flags_given(parse([])) == []
    assert _process_flags_given(parse(["--num-gpus", "8"])) == ["--num-gpus"]
    # argparse's abbreviations and the = form set the same values
    assert _process_flags_given(parse(["--num-gpu=8", "--machine-r", "1"])) == [
        "--num-gpus",
        "--machine-rank",
    ]
    # a trailing KEY VALUE pair that looks like a flag is an override, not a flag
    assert _process_flags_given(parse(["MODEL.X", "--num-gpus"])) == []


def test_every_launched_worker_ends_with_its_process_groups_destroyed(tmp_path):
    """Detectron2's launch leaves the groups (and comm's references) alive; gloo's threads
    then outlive the interpreter and abort some processes at exit, evaluation-only runs too."""
    import torch.distributed as dist
    from detectron2.utils import comm

    from largedet.launch.processes import _run_then_shut_down

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        comm.create_local_process_group(1)
        seen = []
        _run_then_shut_down(lambda a: seen.append((a, dist.is_initialized())), "args")
        assert seen == [("args", True)]
        assert not dist.is_initialized() and comm._LOCAL_PROCESS_GROUP is None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
            comm._LOCAL_PROCESS_GROUP = None


def test_launch_routes_every_process_of_a_distributed_job_through_the_shut_down(monkeypatch):
    import importlib

    launch_module = importlib.import_module("largedet.launch.processes")  # the module, not the function
    calls = []
    monkeypatch.setattr(launch_module, "d2_launch", lambda fn, n, **kw: calls.append((fn, n, kw["args"])))
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    main = print
    two = argparse.Namespace(num_gpus=2, num_machines=1, machine_rank=0, dist_url="auto")
    launch_module.launch(main, two)
    assert calls[-1] == (launch_module._run_then_shut_down, 2, (main, two))
    # one process: Detectron2 runs main here, in the caller's process, with no process
    # group to shut down; only a full disk is turned into its one line
    one = argparse.Namespace(num_gpus=1, num_machines=1, machine_rank=0, dist_url="auto")
    launch_module.launch(main, one)
    assert calls[-1] == (launch_module._run_alone, 1, (main, one))
    seen = []
    launch_module._run_alone(seen.append, one)
    assert seen == [one]


def test_one_machine_at_the_default_dist_url_takes_a_free_port(monkeypatch):
    """Two runs at once on one machine with Detectron2's default --dist-url (one fixed port per
    user) would meet EADDRINUSE: on one machine the default becomes a free port ("auto");
    a --dist-url given, and several machines, keep theirs."""
    import importlib

    from detectron2.engine import default_argument_parser

    launch_module = importlib.import_module("largedet.launch.processes")
    urls = []
    monkeypatch.setattr(launch_module, "d2_launch", lambda fn, n, **kw: urls.append(kw["dist_url"]))
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    default = default_argument_parser().parse_args([]).dist_url
    assert default.startswith("tcp://127.0.0.1:")
    for machines, given, expected in [(1, default, "auto"), (1, "tcp://127.0.0.1:23456", "tcp://127.0.0.1:23456"),
                                      (2, default, default), (2, "tcp://head:1234", "tcp://head:1234")]:  # fmt: skip
        args = argparse.Namespace(num_gpus=2, num_machines=machines, machine_rank=0, dist_url=given)
        launch_module.launch(print, args)
        assert urls[-1] == expected, (machines, given)


@pytest.mark.parametrize("rank, prints, waits", [("0", True, False), ("1", False, True)])
def test_a_refused_check_under_torchrun_lets_the_first_process_say_why(monkeypatch, capsys, rank, prints, waits):
    """torchrun stops every process when one exits: a process other than the first waits
    (until the launcher stops it) instead of exiting at once, so that the first one's error
    line is printed; the first prints it and exits 2 without waiting."""
    from largedet.config.validate import ConfigError
    from largedet.engine import defaults
    from largedet.launch import job

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("LOCAL_RANK", rank)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    slept = []
    monkeypatch.setattr(job.time, "sleep", slept.append)
    args = defaults.largedet_argument_parser().parse_args([])

    def refuse(_args):
        raise ConfigError("SOLVER.IMS_PER_BATCH 3 is not divisible by the world size 2")

    with pytest.raises(SystemExit) as stop:
        job.check_and_launch(lambda a: None, args, refuse)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert (err == "error: SOLVER.IMS_PER_BATCH 3 is not divisible by the world size 2\n") is prints
    assert slept == ([job.OTHER_PROCESSES_WAIT_S] if waits else [])


def _run_script(tmp_path, text, *args):
    """``text`` run as a script of its own, one thread, outside any torchrun environment."""
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=240, env={**env, "OMP_NUM_THREADS": "1"})  # fmt: skip


_EXIT_AFTER_PREEMPTION = """
import argparse, atexit, os, signal, sys, time
from largedet.launch.processes import launch
from largedet.launch.preemption import Preempted


def main(args):
    raise Preempted(3, "model_0000003.pth")  # what every rank raises after the checkpoint


def second_signal():  # a cluster's second SIGTERM while the process exits
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)


if __name__ == "__main__":
    atexit.register(second_signal)
    launch(main, argparse.Namespace(num_gpus=int(sys.argv[1]), num_machines=1, machine_rank=0, dist_url="auto"))
"""


@pytest.mark.parametrize("processes", [1, 2])
def test_a_second_signal_after_the_preemption_checkpoint_keeps_exit_75(tmp_path, processes):
    done = _run_script(tmp_path, _EXIT_AFTER_PREEMPTION, str(processes))
    assert done.returncode == 75, done.stderr[-2000:]
    assert "SIGTERM ignored: the checkpoint is written, exiting 75" in done.stderr


_RANK_KILLED = """
import argparse, os, signal, time
from detectron2.utils import comm
from largedet.launch.processes import launch


def main(args):
    if comm.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
    time.sleep(60)


if __name__ == "__main__":
    launch(main, argparse.Namespace(num_gpus=2, num_machines=1, machine_rank=0, dist_url="auto"))
"""


def test_a_killed_process_of_the_job_is_one_line_and_exit_69(tmp_path):
    done = _run_script(tmp_path, _RANK_KILLED)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 69 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith("error: process 1 of the job (pid ")
    assert "was killed by SIGKILL (the kernel's out-of-memory killer, or kill -9)" in errors[0]
    assert "Traceback" not in done.stderr
