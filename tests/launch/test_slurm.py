"""Slurm through submitit (largedet.launch.slurm): the executor's parameters and sbatch flags,
each node's command line, and a pre-empted job that submitit's local executor requeues and
that resumes to the weights of an uninterrupted run (two gloo processes, tools/train_net.py)."""

import os
import pickle
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

submitit = pytest.importorskip("submitit")

from largedet.launch.slurm import (  # noqa: E402
    Placement,
    SlurmResources,
    TrainingJob,
    placement,
    submit,
)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.abspath(os.path.join(ROOT, "tools", "train_net.py"))
SUBMIT = os.path.join(ROOT, "tools", "submit.py")
CONFIG = os.path.abspath(
    os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")
)


def test_executor_parameters_and_sbatch_flags(tmp_path, monkeypatch):
    resources = SlurmResources(
        nodes=2, gpus_per_node=8, cpus_per_gpu=10, partition="P", timeout_min=240
    )
    params = resources.executor_parameters()
    assert params == dict(
        name="largedet", nodes=2, tasks_per_node=1, gpus_per_node=8, cpus_per_task=80,
        timeout_min=240, slurm_signal_delay_s=120, slurm_partition="P",
        slurm_additional_parameters={"requeue": True},
    )  # fmt: skip
    monkeypatch.setattr(
        submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2)
    )  # no srun here
    executor = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm")
    executor.update_parameters(**params)
    sbatch = executor._executor._make_submission_file_text("CMD", "uid").splitlines()
    flags = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=80",
             "--partition=P", "--time=240", "--signal=USR2@120", "--job-name=largedet",
             "--requeue"]  # fmt: skip
    for flag in flags:
        assert f"#SBATCH {flag}" in sbatch


def _sbatch_script(resources, tmp_path, monkeypatch):
    """The batch script ``submit`` would hand to sbatch for ``resources``."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    captured = {}

    def fake_submit(self, fn, *args, **kwargs):
        inner = self._executor
        captured["script"] = inner._make_submission_file_text(inner._submitit_command_str, "uid")

    monkeypatch.setattr(submitit.AutoExecutor, "submit", fake_submit)
    submit(TrainingJob(TRAIN_NET, 0), resources, str(tmp_path / "%j"))
    return captured["script"].splitlines()


def test_one_node_jobs_exec_their_task_in_the_batch_shell(tmp_path, monkeypatch):
    """scancel --full and -b signal the batch shell: with one node it is the job's task itself
    (exec, no srun, which would SIGKILL the training on a SIGTERM of its own)."""
    one = SlurmResources(nodes=1, gpus_per_node=0)
    assert one.task_in_batch_shell and one.executor_parameters()["slurm_use_srun"] is False
    lines = _sbatch_script(one, tmp_path, monkeypatch)
    assert lines[-1].startswith("exec " + sys.executable) and "srun" not in "\n".join(lines)
    # the time-out signal reaches the batch shell (the job has no steps for a plain --signal)
    assert "#SBATCH --signal=B:USR2@120" in lines and "#SBATCH --signal=USR2@120" not in lines
    for several in (SlurmResources(nodes=2), SlurmResources(nodes=1, srun=True), SlurmResources(nodes=2, elastic_min_nodes=1)):
        assert not several.task_in_batch_shell and "slurm_use_srun" not in several.executor_parameters()
    lines = _sbatch_script(SlurmResources(nodes=2), tmp_path, monkeypatch)
    assert lines[-1].startswith("srun ") and "exec " not in lines[-1]
    assert "#SBATCH --signal=USR2@120" in lines


def fake_env(num_nodes, node, job_id="4242", hosts=("gpu-a", "gpu-b")):
    return SimpleNamespace(num_nodes=num_nodes, node=node, job_id=job_id, hostnames=list(hosts))


def test_placement_of_each_node():
    assert placement(fake_env(1, 0)) == Placement(1, 0, "auto")
    first, second = placement(fake_env(2, 0)), placement(fake_env(2, 1))
    assert (first.num_machines, first.machine_rank, second.machine_rank) == (2, 0, 1)
    assert first.dist_url == second.dist_url and first.dist_url.startswith("tcp://gpu-a:")
    port = int(first.dist_url.rsplit(":", 1)[1])
    assert 10000 <= port < 30000
    assert placement(fake_env(2, 0), attempt=1).dist_url != first.dist_url


def test_command_of_a_node_and_the_requeued_job(monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    job = TrainingJob(TRAIN_NET, 8, config_file="cfg.yaml", opts=["SOLVER.MAX_ITER", "10"])
    where = Placement(2, 1, "tcp://gpu-a:12345")
    assert job.command(where) == [
        sys.executable, TRAIN_NET, "--config-file", "cfg.yaml", "--num-gpus", "8", "--num-machines", "2",
        "--machine-rank", "1", "--dist-url", "tcp://gpu-a:12345", "SOLVER.MAX_ITER", "10",
    ]  # fmt: skip
    requeued = job.checkpoint()
    assert requeued.function == TrainingJob(
        TRAIN_NET, 8, "cfg.yaml", ["SOLVER.MAX_ITER", "10"], resume=True, attempt=1
    )
    assert requeued.function.command(where)[-3:] == ["--resume", "SOLVER.MAX_ITER", "10"]
    assert pickle.loads(pickle.dumps(requeued.function)) == requeued.function
    # requeued by Slurm itself (PreemptMode=REQUEUE), without checkpoint(): resumes all the same
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert "--resume" in job.command(where)


def test_submit_refuses_a_batch_that_does_not_split_before_queuing(tmp_path):
    proc = subprocess.run(
        [sys.executable, SUBMIT, "--local", "--gpus-per-node", "3", "--config", CONFIG,
         "--job-dir", str(tmp_path / "jobs"), "SOLVER.IMS_PER_BATCH", "4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "SOLVER.IMS_PER_BATCH 4 is not divisible by the world size 3" in proc.stderr
    assert not (tmp_path / "jobs").exists()


# --- pre-emption, requeue and resume ---------------------------------------------------------


def train_opts(spec, out_dir):
    """The demo config on the tiny shapes set at 64 px: 6 steps of 4 images on two processes
    (K = 2 micro-batches of 1 each), a checkpoint every 2 steps, exact resume."""
    return [
        "DATASETS.SHAPES.ROOT", spec.root, "DATASETS.SHAPES.NUM_TRAIN", str(spec.num_train),
        "DATASETS.SHAPES.NUM_VAL", str(spec.num_val), "DATASETS.SHAPES.IMAGE_SIZE", str(spec.image_size),
        "DATASETS.SHAPES.SEED", str(spec.seed), "DATASETS.TEST", "()",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64",
        "SOLVER.IMS_PER_BATCH", "4", "SOLVER.IMS_PER_DEVICE", "1", "SOLVER.MAX_ITER", "6",
        "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "(4,)", "SOLVER.CHECKPOINT_PERIOD", "2",
        "DATALOADER.NUM_WORKERS", "0", "SEED", "0", "RESEED_EVERY_ITER", "True", "OUTPUT_DIR", str(out_dir),
    ]  # fmt: skip


#: the pre-empted run holds after step 2 (its first checkpoint) until its signal arrives (holds.py):
#: the test's signal always comes before the run could end, however busy the host
HOLD = ["IMPORTS", "('holds',)", "HOOKS", "('HoldAfterSecondStep',)"]


def local_job(spec, out_dir, folder, extra=()):
    job = TrainingJob(
        TRAIN_NET, gpus_per_node=2, config_file=CONFIG, opts=train_opts(spec, out_dir) + list(extra)
    )
    return submit(job, SlurmResources(nodes=1, gpus_per_node=2, cpus_per_gpu=1, timeout_min=30),
                  str(folder), cluster="local")  # fmt: skip


def task_pids(job):
    """The job's task processes: the children of submitit's local controller."""
    pid = job._process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def final_weights(out_dir):
    return torch.load(out_dir / "model_final.pth", map_location="cpu", weights_only=False)["model"]


def test_preempted_job_is_requeued_and_resumes_to_the_same_weights(tiny_shapes, tmp_path, monkeypatch):
    # one thread per training process: on a Xeon with AMX two runs with two threads each
    # differ from step 3 on (~1e-6: oneDNN's multi-threaded float32 kernels are not
    # run-to-run deterministic there), one thread each gives the same weights every run
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plain = local_job(tiny_shapes, tmp_path / "plain", tmp_path / "jobs_plain")
    plain.result()

    out_dir = tmp_path / "preempted"
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    job = local_job(tiny_shapes, out_dir, tmp_path / "jobs_preempted", HOLD)
    deadline = time.monotonic() + 600
    while not (out_dir / "last_checkpoint").exists():  # the checkpoint after step 2 of 6
        assert job.state == "RUNNING" and time.monotonic() < deadline, job.stderr()
        time.sleep(0.05)
    assert not (out_dir / "model_final.pth").exists()
    (task,) = task_pids(job)
    os.kill(task, submitit.JobEnvironment._usr_sig())  # what Slurm sends on pre-emption
    job.result()

    log = job.stdout() + job.stderr()
    assert "this job is preempted" in log and "Requeued job" in log
    train_log = (out_dir / "log.txt").read_text()
    starts = [line for line in train_log.splitlines() if "Starting training from iteration" in line]
    assert len(starts) == 2 and starts[0].endswith("iteration 0"), starts
    # the training processes saved the step they were in when stopped: none is trained twice
    (stopped,) = [int(line.split("pre-empted at iteration ")[1].split()[0])
                  for line in train_log.splitlines() if "pre-empted at iteration" in line]  # fmt: skip
    assert starts[1].endswith(f"iteration {stopped + 1}"), (starts, stopped)
    assert "Data stream resumes after" in train_log
    expected, resumed = final_weights(tmp_path / "plain"), final_weights(out_dir)
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)


def test_slurm_task_environment_from_slurms_variables():
    from largedet.launch.processes import first_host, slurm_task_environment

    assert first_host("node[07-09,12],gpu3") == "node07" and first_host("rack[1-2]-n[01-04]") == "rack1-n01"
    # task 3 of 4, on the second of two nodes, as srun sets them without --ntasks-per-node
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_ID": "42"}  # fmt: skip
    got = slurm_task_environment(env)
    assert {k: got[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu01"
    }  # fmt: skip
    assert 10000 <= int(got["MASTER_PORT"]) < 30000
    assert slurm_task_environment({**env, "SLURM_RESTART_COUNT": "1"})["MASTER_PORT"] != got["MASTER_PORT"]
    given = slurm_task_environment({**env, "MASTER_ADDR": "head", "MASTER_PORT": "29500"})
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("head", "29500")


def test_resources_without_gpus_and_with_sbatch_options():
    params = SlurmResources(
        gpus_per_node=0, processes_per_node=2, cpus_per_gpu=3, srun=True, account="a", qos="q",
        constraint="c", exclude="n1", sbatch={"mail-type": "END", "exclusive": True},
    ).executor_parameters()  # fmt: skip
    assert "gpus_per_node" not in params
    assert (params["tasks_per_node"], params["cpus_per_task"]) == (2, 3)
    assert (params["slurm_account"], params["slurm_qos"], params["slurm_constraint"], params["slurm_exclude"]) == ("a", "q", "c", "n1")
    assert params["slurm_additional_parameters"] == {"requeue": True, "mail-type": "END", "exclusive": True}


# --- the training script's exit status ---------------------------------------------------------

FAKE_TRAINER = """import sys
# exits with the status given as its last argument; with --resume, 0
sys.exit(0 if "--resume" in sys.argv else int(sys.argv[-1]))
"""


@pytest.fixture
def fake_trainer(tmp_path):
    script = tmp_path / "fake_train_net.py"
    script.write_text(FAKE_TRAINER)
    return str(script)


@pytest.fixture
def local_task_env(monkeypatch):
    """The variables submitit's local executor sets in a job's task (task 0 of job 7)."""
    for name, value in {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "7",
                        "SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
                        "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "0",
                        "SUBMITIT_LOCAL_LOCALID": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


@pytest.fixture
def submitit_handlers(tmp_path):
    """submitit's signal handlers installed for a job as its task installs them
    (``process_job``); the previous handlers restored afterwards."""
    signals = (signal.SIGTERM, signal.SIGCONT, submitit.JobEnvironment._usr_sig())
    before = {s: signal.getsignal(s) for s in signals}

    def install(job):
        delayed = submitit.helpers.DelayedSubmission(job)
        delayed.set_timeout(30, 3)
        paths = submitit.core.utils.JobPaths(tmp_path / "jobs", job_id="7")
        paths.folder.mkdir(parents=True)
        submitit.JobEnvironment()._handle_signals(paths, delayed)
        return paths

    yield install
    for s, handler in before.items():
        signal.signal(s, handler)


def test_exit_75_requeues_through_submitits_preemption_path(fake_trainer, local_task_env, submitit_handlers):
    job = TrainingJob(fake_trainer, 1, opts=["75"])
    paths = submitit_handlers(job)
    with pytest.raises(SystemExit) as exited:  # no CalledProcessError: submitit requeues
        job()
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    assert exited.value.code == LOCAL_REQUEUE_RETURN_CODE  # the local executor's "requeue me"
    requeued = submitit.helpers.DelayedSubmission.load(paths.submitted_pickle).function
    # the job learnt its id from the task's environment (torchrun's --rdzv-id for elastic jobs)
    assert requeued == TrainingJob(fake_trainer, 1, opts=["75"], resume=True, attempt=1,
                                   job_id=submitit.JobEnvironment().job_id)


STOPPED_TRAINER = """import os, signal, sys, time
# waits for SIGTERM, then exits 1, as torchrun does when its workers stop on a signal; says it
# runs (a file "ready" beside it) once its handler is in place
signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ready"), "w").close()
while "--resume" not in sys.argv:
    time.sleep(0.1)
"""


def test_a_job_requeues_on_a_cluster_signal_whatever_the_stopped_script_exits(tmp_path, local_task_env, submitit_handlers):
    """scancel's SIGUSR1 to the job's task: the task stops the training (SIGTERM); the script
    (torchrun-like) exits 1, not 75; the job requeues all the same, and puts back the
    signal handlers it replaced."""
    import threading

    script = tmp_path / "torchrun_like.py"
    script.write_text(STOPPED_TRAINER)
    job = TrainingJob(str(script), 1)
    paths = submitit_handlers(job)
    before = signal.getsignal(signal.SIGUSR1)

    def signal_once_it_runs():  # the cluster's signal reaches a task whose script runs
        deadline = time.monotonic() + 300
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=signal_once_it_runs, daemon=True).start()
    with pytest.raises(SystemExit) as exited:
        job()
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    assert exited.value.code == LOCAL_REQUEUE_RETURN_CODE
    assert submitit.helpers.DelayedSubmission.load(paths.submitted_pickle).function.resume
    assert signal.getsignal(signal.SIGUSR1) == before


def test_other_exit_statuses_of_the_training_script(fake_trainer, local_task_env, submitit_handlers):
    submitit_handlers(TrainingJob(fake_trainer, 1))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        TrainingJob(fake_trainer, 1, opts=["1"])()
    assert failed.value.returncode == 1
    assert TrainingJob(fake_trainer, 1, opts=["0"])() is None


def test_exit_75_under_the_local_executor_is_a_requeue_not_an_exception(fake_trainer, tmp_path):
    resources = SlurmResources(nodes=1, gpus_per_node=1, cpus_per_gpu=1, timeout_min=60)
    job = submit(TrainingJob(fake_trainer, 1, opts=["75"]), resources, str(tmp_path / "jobs"),
                 cluster="local")  # fmt: skip
    assert job.result() is None  # the requeued run (--resume) exits 0
    log = job.stdout() + job.stderr()
    assert "exited 75 (pre-empted, checkpoint written): requeuing" in log
    assert "this job is preempted" in log and "Requeued job" in log
    assert "triggered an exception" not in log and "CalledProcessError" not in log


def test_an_elastic_job_runs_torchrun_on_each_node_and_survives_a_node_failure(monkeypatch):
    """--elastic MIN: each node's task is a torchrun agent (--nnodes MIN:NODES, c10d rendezvous
    on the first node, the Slurm job id as --rdzv-id), and the job asks Slurm for --no-kill."""
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    job = TrainingJob(TRAIN_NET, 8, config_file="cfg.yaml", elastic_min_nodes=2, max_restarts=5, job_id="4242")
    assert job.command(Placement(3, 1, "tcp://gpu-a:12345")) == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "8",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu-a:12345", "--rdzv-id", "slurm-4242",
        "--max-restarts", "5", TRAIN_NET, "--config-file", "cfg.yaml",
    ]  # fmt: skip
    # the wheel's largedet-submit runs modules: torchrun's -m, then the module
    module = TrainingJob("-m largedet.engine.train_net", 8, elastic_min_nodes=2, job_id="4242")
    assert module.command(Placement(3, 1, "tcp://gpu-a:12345"))[-2:] == ["-m", "largedet.engine.train_net"]
    assert TrainingJob("-m largedet.engine.train_net", 8).command(Placement(1, 0, "auto"))[:3] == [
        sys.executable, "-m", "largedet.engine.train_net"]  # fmt: skip
    # the agents publish each round's store address (a machine that comes back is admitted)
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    assert job.environment()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in TrainingJob(TRAIN_NET, 8).environment()
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")  # the user's own choice stays
    assert job.environment()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
    params = SlurmResources(nodes=3, elastic_min_nodes=2).executor_parameters()
    assert params["slurm_additional_parameters"] == {"requeue": True, "no-kill": True}
    assert "no-kill" not in SlurmResources(nodes=3).executor_parameters()["slurm_additional_parameters"]
    with pytest.raises(ValueError, match="elastic_min_nodes"):
        SlurmResources(nodes=2, elastic_min_nodes=3)
    with pytest.raises(ValueError, match="elastic_min_nodes"):
        SlurmResources(nodes=2, elastic_min_nodes=1, srun=True)


def test_submit_checks_an_elastic_job_for_every_node_count(tmp_path):
    """A batch that splits over 2 nodes of 2 processes but not over 3 is refused before queuing."""
    proc = subprocess.run(
        [sys.executable, SUBMIT, "--nodes", "3", "--elastic", "2", "--gpus-per-node", "0",
         "--processes-per-node", "2", "--config", CONFIG, "--job-dir", str(tmp_path / "jobs"),
         "SOLVER.IMS_PER_BATCH", "8", "SOLVER.IMS_PER_DEVICE", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "world size 6 x SOLVER.IMS_PER_DEVICE 2 = 12" in proc.stderr
    assert not (tmp_path / "jobs").exists()
