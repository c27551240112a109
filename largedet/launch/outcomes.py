"""How a run ends, as data: each exit status of the training scripts, and what each signal a
cluster sends does, from the constants that the code exits with. The documentation's tables
are generated from :data:`EXIT_STATUSES` and :data:`SIGNALS` (``docs/reliability.md``,
``docs/launching.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from .elastic import LOST_PROCESS_EXIT_CODE
from .preemption import CANCELLED_EXIT_CODE, PREEMPTED_EXIT_CODE
from .processes import DISK_FULL_EXIT_CODE, DIVERGED_EXIT_CODE, FORWARDED_SIGNALS, NO_CHECKPOINT_EXIT_CODE

__all__ = ["CONFIG_ERROR_EXIT_CODE", "EXIT_STATUSES", "SIGNALS", "ExitStatus", "SignalEffect"]

#: Exit status of a command line or config refused before any process starts (argparse's)
CONFIG_ERROR_EXIT_CODE = 2


@dataclass(frozen=True)
class ExitStatus:
    """One exit status of the training scripts and what it means."""

    status: int
    run_summary: str  # the ``status`` that run_summary.json records ("" where none is written)
    meaning: str


#: Every exit status of the training scripts, in order
EXIT_STATUSES = (
    ExitStatus(0, "finished", "the run trained its last step (and evaluated), or the evaluation ended"),
    ExitStatus(CONFIG_ERROR_EXIT_CODE, "", "a command line, config, dataset or weights file refused before "
               "any process starts: one line, `error: <file or key>: <what>`"),
    ExitStatus(DIVERGED_EXIT_CODE, "diverged", "the loss diverged (non-finite or exploding) and no rollback "
               "was left: one line naming the iteration and the last good checkpoint"),
    ExitStatus(NO_CHECKPOINT_EXIT_CODE, "", "`--resume` found checkpoints of which none loads, weights at a "
               "URL could not be fetched, or a save would have written over a checkpoint of a later iteration"),
    ExitStatus(LOST_PROCESS_EXIT_CODE, "lost_process", "a process of the job was lost (a collective failed, a "
               "process was killed); torchrun's elastic agent restarts the workers on it"),
    ExitStatus(DISK_FULL_EXIT_CODE, "failed", "a file of the run could not be written for lack of space; the "
               "previous checkpoint is intact"),
    ExitStatus(PREEMPTED_EXIT_CODE, "preempted", "a stop signal (pre-emption, requeue, time limit, "
               "`scancel --signal`): the step finished and a checkpoint written; a Slurm job is requeued"),
    ExitStatus(CANCELLED_EXIT_CODE, "cancelled", "the Slurm job was cancelled (`scancel` without "
               "`--signal`): the step finished and a checkpoint written; the job is not requeued"),
)  # fmt: skip


@dataclass(frozen=True)
class SignalEffect:
    """What a signal from a cluster (or a person) does to a training job."""

    sent_by: str
    signals: str
    effect: str
    requeued: str


#: What each way of signalling a job does (``PREEMPTION.SIGNALS`` at its default)
SIGNALS = (
    SignalEffect("Slurm, `signal_delay_s` before the time limit, and on pre-emption where the cluster "
                 "sends it (`preempt_send_user_signal`)", "SIGUSR2 (submitit's)",
                 f"checkpoint at the end of the step, exit {PREEMPTED_EXIT_CODE}", "yes, with --resume"),
    SignalEffect("`scontrol requeue`, pre-emption with `PreemptMode=REQUEUE`", "SIGTERM",
                 f"checkpoint at the end of the step, exit {PREEMPTED_EXIT_CODE}", "yes (Slurm), with --resume"),
    SignalEffect("`scancel --signal=SIG JOBID` (with `--full` or `-b`)", "SIGTERM, SIGINT, SIGHUP, SIGUSR1",
                 f"checkpoint at the end of the step, exit {PREEMPTED_EXIT_CODE}", "yes, with --resume"),
    SignalEffect("`scancel JOBID`", "SIGTERM (the job cancelled)",
                 f"checkpoint at the end of the step, exit {CANCELLED_EXIT_CODE}, run summary `cancelled`",
                 "no: the job ends; --resume continues from the checkpoint"),
    SignalEffect("torchrun, a person (`kill`, Ctrl-C)", ", ".join(s.name for s in FORWARDED_SIGNALS),
                 f"checkpoint at the end of the step, exit {PREEMPTED_EXIT_CODE}", "by whoever restarts it"),
    SignalEffect("the kernel's out-of-memory killer, `kill -9`", "SIGKILL",
                 f"nothing is written; the job's other processes stop, exit {LOST_PROCESS_EXIT_CODE}",
                 "--resume continues from the latest complete checkpoint"),
)  # fmt: skip
