"""Training on a Slurm cluster through submitit, requeued on pre-emption and time-out.

``tools/submit.py`` submits a :class:`TrainingJob`: one Slurm task per node, which starts
a training script (``tools/train_net.py``, ``tools/lazyconfig_train_net.py`` or
``projects/video/train.py``) with Detectron2's multi-machine flags, ``--num-gpus G
--num-machines N --machine-rank NODE --dist-url tcp://FIRST_NODE:PORT`` (:func:`placement`);
Detectron2's ``launch`` in the script then starts one process per GPU on each node and sets
up ``torch.distributed`` (NCCL, or gloo on CPUs), exactly as when the script is started by
hand on every machine. With ``SlurmResources(srun=True)`` each training process is a Slurm
task instead, started by ``srun``: the script runs with ``--launcher slurm`` and joins the
process group from ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS`` and the job's first
node (:func:`largedet.launch.processes.slurm_task_environment`). Without GPUs
(``gpus_per_node=0``) the job asks for none and its processes run on CPUs (gloo). The scripts keep their own ``main`` (the video project its trainer),
so the job runs them as programs rather than importing them.

With ``SlurmResources(elastic_min_nodes=M)`` each node's task runs the script under an elastic
``torchrun`` agent instead (``--nnodes M:N``, c10d rendezvous on the job's first node,
``--rdzv-id`` the Slurm job id, ``--max-restarts``) and the job asks Slurm not to end on a node
failure (``--no-kill``): when a node is lost, the agents on the others restart their workers,
which resume from the newest complete checkpoint on the nodes that are left
(:mod:`largedet.launch.elastic`); the first node, which holds the rendezvous, must survive.

Pre-emption and time-out: Slurm signals the job (``USR2``, ``signal_delay_s`` before the
time limit, and on pre-emption where the cluster sends it:
``SlurmctldParameters=preempt_send_user_signal``). submitit's handler in the task of node 0
calls :meth:`TrainingJob.checkpoint`, which stops the training processes and hands back the
same job with ``--resume``; submitit requeues it (pre-emptions without limit, time-outs
``max_num_timeout`` times). Stopping the training processes is a SIGTERM to them all, on
which they finish the current optimizer step, write a checkpoint and exit
(:mod:`largedet.launch.preemption`); the job waits for that up to the signal delay less
:data:`STOP_MARGIN_S` (``SlurmResources.signal_delay_s``, so within the time Slurm gives),
then kills what is left. The requeued job continues from that checkpoint: no step is
trained twice, and with exact resume (``SEED >= 0``, ``RESEED_EVERY_ITER``) the run ends on
the weights of an uninterrupted one. A job that Slurm requeues by itself
(``PreemptMode=REQUEUE``, a node failure) resumes too (``SLURM_RESTART_COUNT``), from the
last checkpoint written. The training processes ignore submitit's signal themselves: only
the job decides when they stop. A training script that another signal stopped (``scancel
--signal``, ``scontrol requeue``) exits 75 with its checkpoint written; the job then takes
the same requeue path as submitit's signal, not an error. ``scancel`` without ``--signal``
cancels: the training stops the same way and writes its checkpoint, exits
:data:`~largedet.launch.preemption.CANCELLED_EXIT_CODE` and the job is not requeued
(:mod:`largedet.launch.slurm_state`). Any other
non-zero exit fails the job (``CalledProcessError``). The job's task passes SIGTERM, SIGINT,
SIGHUP and SIGUSR1 on to the training as a SIGTERM (:data:`RELAYED_SIGNALS`); a one-node job's
task *is* its batch shell (:attr:`SlurmResources.task_in_batch_shell`), so ``scancel --full``
and ``scancel -b`` reach it too.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence

import submitit

from .elastic import AGENT_ENVIRONMENT
from .preemption import CANCELLED_EXIT_CODE, PREEMPTED_EXIT_CODE
from .slurm_state import slurm_job_cancelled

__all__ = ["Placement", "SlurmResources", "TrainingJob", "placement", "submit"]

logger = logging.getLogger(__name__)

#: Seconds the training script gets to exit on SIGTERM before it is killed, unless the job
#: is given more (``TrainingJob.stop_timeout_s``).
STOP_TIMEOUT_S = 30
#: Seconds of Slurm's signal delay kept back for submitit's requeue after the stop.
STOP_MARGIN_S = 20
#: Seconds between two looks at whether the training script has exited.
POLL_S = 1.0
#: Signals on which the job's task stops training with a checkpoint and requeues (submitit's
#: own pre-emption signal, SIGUSR2, goes through :meth:`TrainingJob.checkpoint`).
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: Cores per training process on GPU nodes, unless the job is given another number.
CPUS_PER_GPU = 10


@dataclass(frozen=True)
class SlurmResources:
    """What a training job asks Slurm for: ``processes_per_node`` training processes on each
    node (default one per GPU; one without GPUs), ``cpus_per_gpu`` cores each (0, the
    default: :data:`CPUS_PER_GPU` with GPUs; without them one core per process, which a
    small CPU node can give: :attr:`cpus_per_process`). By default
    one Slurm task per node holds all of the node's GPUs and starts the processes; with
    ``srun`` each process is a Slurm task of its own. ``gpus_per_node`` 0 asks for no GPUs
    (no gres): the processes run on CPUs. ``account``, ``qos``, ``constraint`` and
    ``exclude`` are sbatch's options of those names; ``sbatch`` holds any other sbatch
    option (``{"mail-type": "END", "exclusive": True}``: ``--mail-type=END --exclusive``)."""

    nodes: int = 1
    gpus_per_node: int = 8  # 0: no GPUs (CPU processes)
    cpus_per_gpu: int = 0  # cores per training process; 0: CPUS_PER_GPU with GPUs, 1 without
    processes_per_node: int = 0  # 0: gpus_per_node, or 1 where that is 0
    srun: bool = False  # one Slurm task per training process
    elastic_min_nodes: int = 0  # > 0: torchrun --nnodes MIN:nodes on each node, the job kept on a node failure
    max_restarts: int = 3  # torchrun's --max-restarts of an elastic job
    partition: str = ""  # "" = the cluster's default partition
    timeout_min: int = 240  # the job's time limit, per (re)queued run, in minutes
    mem_gb: float = 0  # memory per node; 0 = the partition's default
    signal_delay_s: int = 120  # seconds before the time limit at which the job is signalled
    max_num_timeout: int = 20  # time-outs that requeue; pre-emptions requeue without limit
    name: str = "largedet"
    account: str = ""
    qos: str = ""
    constraint: str = ""
    exclude: str = ""
    sbatch: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if min(self.nodes, self.timeout_min) < 1 or min(self.gpus_per_node, self.processes_per_node, self.cpus_per_gpu) < 0:
            raise ValueError(
                f"need nodes and timeout_min >= 1 and gpus_per_node, processes_per_node, cpus_per_gpu "
                f">= 0, got {self.nodes}, {self.timeout_min}, {self.gpus_per_node}, "
                f"{self.processes_per_node} and {self.cpus_per_gpu}"
            )
        if not 0 <= self.elastic_min_nodes <= self.nodes or (self.elastic_min_nodes and self.srun):
            raise ValueError(
                f"elastic_min_nodes must be in [0, nodes {self.nodes}] and without srun (torchrun "
                f"starts the processes), got {self.elastic_min_nodes}"
            )
        if self.gpus_per_node and self.processes_per_node not in (0, self.gpus_per_node):
            raise ValueError(
                f"one training process per GPU: processes_per_node {self.processes_per_node} "
                f"with gpus_per_node {self.gpus_per_node}"
            )

    @property
    def processes(self) -> int:
        """Training processes per node."""
        return self.processes_per_node or self.gpus_per_node or 1

    @property
    def cpus_per_process(self) -> int:
        """Cores asked for each training process: ``cpus_per_gpu``, else :data:`CPUS_PER_GPU`
        with GPUs and 1 without (a CPU node of a few cores could never hold the GPU default,
        and the job would pend for ever)."""
        return self.cpus_per_gpu or (CPUS_PER_GPU if self.gpus_per_node else 1)

    @property
    def task_in_batch_shell(self) -> bool:
        """One node, one task: the batch script *becomes* the job's task (``exec``, no
        ``srun``), so that a signal to the batch shell (``scancel --full``, ``scancel -b``)
        reaches the job, which stops training with a checkpoint and requeues; Slurm's
        time-out signal is then sent to the batch shell too (``--signal=B:USR2@DELAY``: a
        job without steps would get none). With ``srun``
        in the batch script (several nodes, ``srun`` mode, elastic) a SIGTERM, SIGHUP or
        SIGQUIT that reaches ``srun`` itself (``scancel --full``) makes it SIGKILL its tasks:
        pre-empt such jobs through their steps (``scancel --signal=TERM JOBID``, no
        ``--full``) or with SIGUSR1/SIGUSR2, which ``srun`` forwards (docs/launching.md)."""
        return self.nodes == 1 and not self.srun and not self.elastic_min_nodes

    def executor_parameters(self) -> Dict[str, Any]:
        """The keyword arguments of submitit's ``AutoExecutor.update_parameters``; the
        ``slurm_`` ones are ignored by the local executor."""
        tasks = self.processes if self.srun else 1
        params: Dict[str, Any] = dict(
            name=self.name,
            nodes=self.nodes,
            tasks_per_node=tasks,
            cpus_per_task=self.cpus_per_process * self.processes // tasks,
            timeout_min=self.timeout_min,
            slurm_signal_delay_s=self.signal_delay_s,
            # requeueable: `scontrol requeue` (submitit's requeue) is refused otherwise where
            # the cluster's JobRequeue is 0
            slurm_additional_parameters={
                "requeue": True,
                # elastic: a failed node leaves the job (and its other tasks) running
                **({"no-kill": True} if self.elastic_min_nodes else {}),
                **self.sbatch,
            },
        )
        if self.task_in_batch_shell:
            params["slurm_use_srun"] = False
            # Slurm's --signal without B: signals the job's steps, and this job has none: its
            # task is the batch shell, which the time-out signal must reach
            params["slurm_additional_parameters"].setdefault(
                "signal", f"B:{submitit.JobEnvironment.USR_SIG}@{self.signal_delay_s}"
            )
        if self.gpus_per_node:  # no gres at all without GPUs: CPU partitions refuse one
            params["gpus_per_node"] = self.gpus_per_node
        for option in ("partition", "account", "qos", "constraint", "exclude"):
            if getattr(self, option):
                params[f"slurm_{option}"] = getattr(self, option)
        if self.mem_gb:
            params["mem_gb"] = self.mem_gb
        return params


@dataclass(frozen=True)
class Placement:
    """Where this node's processes sit in the job: Detectron2's multi-machine arguments."""

    num_machines: int
    machine_rank: int
    dist_url: str  # "auto" (a free port on this machine) for one node

    def args(self) -> List[str]:
        return ["--num-machines", str(self.num_machines), "--machine-rank", str(self.machine_rank),
                "--dist-url", self.dist_url]  # fmt: skip

    @property
    def rendezvous(self) -> str:
        """``HOST:PORT`` of :attr:`dist_url`, torchrun's ``--rdzv-endpoint`` (one node: this one)."""
        return "localhost:29400" if self.dist_url == "auto" else self.dist_url[len("tcp://"):]


def placement(env: submitit.JobEnvironment, attempt: int = 0) -> Placement:
    """This node's :class:`Placement` from submitit's job environment (the first host of the
    job's node list is the rendezvous; its port is derived from the job id and the attempt,
    so that every node computes the same one and a requeued run does not meet the last one's
    sockets)."""
    if env.num_nodes == 1:
        return Placement(1, 0, "auto")
    # in [10000, 30000): below Linux's ephemeral ports
    port = 10000 + (zlib.crc32(env.job_id.encode()) + attempt) % 20000
    return Placement(env.num_nodes, env.node, f"tcp://{env.hostnames[0]}:{port}")


@dataclass
class TrainingJob(submitit.helpers.Checkpointable):
    """A training script run on every node of a submitit job, resumed after a requeue.

    Args:
        script: the training script (``tools/train_net.py``, ...), or ``"-m MODULE"`` to run a
            module (``"-m largedet.engine.train_net"``, as the wheel's ``largedet-submit`` does).
        gpus_per_node: training processes per node (``--num-gpus``; on nodes without GPUs,
            CPU processes).
        config_file: ``--config-file`` (None: the script's default).
        opts: the trailing config overrides, as the script takes them.
        imports: the user's modules the script imports in every process (``--import``).
        resume: pass ``--resume`` (continue from the output folder's last checkpoint, or
            start from the config's weights when there is none).
        attempt: how many times the job was requeued before this run.
        srun: each Slurm task is one training process: the script runs with ``--launcher
            slurm`` and joins the process group from Slurm's variables
            (:func:`largedet.launch.processes.slurm_task_environment`), without Detectron2's
            ``launch`` or the machine flags.
        elastic_min_nodes: > 0: the script runs under ``torchrun --nnodes
            MIN:NODES --rdzv-backend c10d`` on each node, restarted on the nodes left
            when one is lost (``max_restarts`` times).
        job_id: the Slurm job's id, torchrun's ``--rdzv-id`` (set in the job).
    """

    script: str
    gpus_per_node: int
    config_file: Optional[str] = None
    opts: Sequence[str] = ()
    imports: Sequence[str] = ()
    resume: bool = False
    attempt: int = 0
    srun: bool = False
    elastic_min_nodes: int = 0
    max_restarts: int = 3
    job_id: str = ""
    # seconds the training processes get to save and exit on SIGTERM (submit sets it
    # from the signal delay)
    stop_timeout_s: float = STOP_TIMEOUT_S
    _process: Optional[subprocess.Popen] = field(
        default=None, init=False, repr=False, compare=False
    )
    # the job sent the training its stop signal (a relayed one, or checkpoint()'s)
    _stop_sent: bool = field(default=False, init=False, repr=False, compare=False)
    # the signal relayed was Slurm's cancel (scancel without --signal)
    _cancelled: bool = field(default=False, init=False, repr=False, compare=False)

    def command(self, where: Optional[Placement]) -> List[str]:
        """The script's command line on a node placed at ``where`` (None with ``srun``); with ``--resume`` also
        when Slurm itself requeued the job (``SLURM_RESTART_COUNT`` > 0: pre-emption with
        ``PreemptMode=REQUEUE``, node failure), which does not go through :meth:`checkpoint`."""
        # a script file, or "-m package.module" (the wheel's commands: no tools/ folder)
        script = self.script.split(maxsplit=1) if self.script.startswith("-m ") else [self.script]
        cmd = [sys.executable, *script]
        if self.elastic_min_nodes:
            cmd[1:1] = [
                "-m", "torch.distributed.run", "--nnodes", f"{self.elastic_min_nodes}:{where.num_machines}",
                "--nproc-per-node", str(self.gpus_per_node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", where.rendezvous, "--rdzv-id", f"slurm-{self.job_id}",
                "--max-restarts", str(self.max_restarts),
            ]  # fmt: skip
        if self.config_file:
            cmd += ["--config-file", self.config_file]
        for module in self.imports:
            cmd += ["--import", module]
        if self.srun:
            cmd += ["--launcher", "slurm"]
        elif not self.elastic_min_nodes:
            cmd += ["--num-gpus", str(self.gpus_per_node), *where.args()]
        if self.resume or int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
            cmd.append("--resume")
        return cmd + list(self.opts)

    def environment(self) -> Dict[str, str]:
        """The script's environment: this process's, and for an elastic job what torchrun's
        agents need (:data:`largedet.launch.elastic.AGENT_ENVIRONMENT`, where not set)."""
        env = dict(os.environ)
        if self.elastic_min_nodes:
            env = {**AGENT_ENVIRONMENT, **env}
        return env

    def __call__(self) -> None:
        # the job's own log lines, beside submitit's in the task's log (a no-op where the
        # process has set up logging already)
        logging.basicConfig(level=logging.INFO, format="largedet %(levelname)s (%(asctime)s) - %(message)s")
        env = submitit.JobEnvironment()
        self.job_id = env.job_id
        cmd = self.command(None if self.srun else placement(env, self.attempt))
        logger.info("%s, attempt %d: %s", env, self.attempt, " ".join(cmd))
        preemption = _preemption_signal()
        previous = {sig: signal.signal(sig, self._relay) for sig in RELAYED_SIGNALS if sig != preemption}
        self._process = subprocess.Popen(
            cmd,
            env=self.environment(),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(preemption, signal.SIG_IGN),
        )
        try:
            # poll rather than wait(): a blocking wait() holds the lock that checkpoint()'s
            # _stop() needs to reap the script, from the signal handler that interrupts it
            while self._process.poll() is None:
                time.sleep(POLL_S)
        finally:
            self._stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        returncode = self._process.returncode
        if returncode == CANCELLED_EXIT_CODE or (returncode != 0 and self._cancelled):
            logger.warning("Cancelled (scancel): the training exited %d with its checkpoint written; "
                           "not requeued (--resume continues from it)", returncode)  # fmt: skip
        elif returncode == PREEMPTED_EXIT_CODE:
            self._requeue_preempted(f"exited {returncode} (pre-empted, checkpoint written)")
        elif returncode != 0 and self._stop_sent:
            # stopped by the job on a cluster's signal: torchrun, for one, exits 1 when its
            # workers have saved and exited 75; --resume continues from the newest checkpoint
            self._requeue_preempted(f"exited {returncode} after the job's stop signal")
        elif returncode != 0:
            raise subprocess.CalledProcessError(returncode, cmd)

    def _relay(self, signum, frame) -> None:
        """A stop signal to the job's task (``scancel --signal``, ``--full``, ``-b``; Slurm's
        ``scontrol requeue``): SIGTERM to the training processes, which finish the step,
        write a checkpoint and exit 75, which requeues the job (:meth:`_requeue_preempted`).
        Slurm's cancel (``scancel`` without ``--signal``,
        :func:`~largedet.launch.slurm_state.slurm_job_cancelled`) stops them the same way,
        and the job is not requeued. A second signal changes nothing (they are saving
        already)."""
        self._cancelled = self._cancelled or slurm_job_cancelled()
        then = "no requeue: the job is cancelled" if self._cancelled else "then requeue"
        logger.warning("Got %s: stopping training at the end of its step (checkpoint, %s)",
                       signal.Signals(signum).name, then)  # fmt: skip
        process = self._process
        if process is not None and process.returncode is None:
            self._stop_sent = True
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _requeue_preempted(self, why: str) -> None:
        """The training script exited :data:`~largedet.launch.preemption.PREEMPTED_EXIT_CODE`
        (or another non-zero status after the job's own stop signal, as torchrun's): it was signalled (``scancel --signal``, ``scontrol requeue``, a signal to the batch
        shell) and wrote its pre-emption checkpoint. Hand the job to submitit's own
        pre-emption path, as Slurm's ``USR2`` does: submitit's handler for that signal (in
        the task of node 0) calls :meth:`checkpoint`, saves the job with ``--resume`` and
        requeues it, and the task exits without an error; in the other tasks it does
        nothing and the task ends. Where Slurm refuses the requeue (a job that
        ``scontrol requeue`` is requeuing already) the task exits with the script's status,
        in one line: a job Slurm restarts resumes all the same (``SLURM_RESTART_COUNT``)."""
        logger.info("The training script %s: requeuing", why)
        try:
            signal.raise_signal(_preemption_signal())
        except subprocess.CalledProcessError as e:  # submitit's `scontrol requeue`
            logger.warning("Slurm refused to requeue the job (%s)", e)
            sys.exit(PREEMPTED_EXIT_CODE)

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on pre-emption or time-out (in the task of node 0): stop the
        training processes and return this job with ``--resume``, to be requeued."""
        logger.info("Pre-empted or timed out: stopping training, requeuing with --resume")
        self._stop()
        return submitit.helpers.DelayedSubmission(
            replace(self, resume=True, attempt=self.attempt + 1)
        )

    def _stop(self) -> None:
        """SIGTERM to the script's process group (the script and the per-GPU processes it
        started), SIGKILL to what is left once the script has exited or after
        :attr:`stop_timeout_s` (they save a checkpoint first)."""
        process = self._process
        if process is None:
            return
        try:
            if process.returncode is None:
                self._stop_sent = True
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:  # the whole group has exited
            return
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("The training script did not exit on SIGTERM; killing it")
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None
        return state


def _preemption_signal() -> signal.Signals:
    return getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)


def submit(
    job: TrainingJob,
    resources: SlurmResources,
    folder: str,
    *,
    cluster: Optional[str] = "slurm",
) -> submitit.Job:
    """Submit ``job`` with ``resources``; submitit's files (pickles, logs) go to ``folder``
    (``%j`` is the job id). ``cluster``: "slurm", or "local" to run it on this machine under
    submitit's local executor (one node; the same signal, checkpoint and requeue path); None
    lets submitit pick."""
    if cluster == "local" and resources.nodes != 1:
        raise ValueError(f"the local executor runs one node, got nodes={resources.nodes}")
    if cluster == "local" and resources.srun:
        raise ValueError("the local executor runs no Slurm tasks: srun needs Slurm")
    # the task replaces the batch shell (SlurmResources.task_in_batch_shell): signals to it reach the job
    python = {"slurm_python": "exec " + shlex.quote(sys.executable)} if resources.task_in_batch_shell else {}
    executor = submitit.AutoExecutor(
        folder=folder, cluster=cluster, slurm_max_num_timeout=resources.max_num_timeout, **python
    )
    executor.update_parameters(**resources.executor_parameters())
    stop = max(STOP_TIMEOUT_S, resources.signal_delay_s - STOP_MARGIN_S)
    return executor.submit(replace(
        job, stop_timeout_s=stop, srun=resources.srun,
        elastic_min_nodes=resources.elastic_min_nodes, max_restarts=resources.max_restarts,
    ))  # fmt: skip
