"""``largedet-submit`` (the wheel's command) and ``tools/submit.py``: submit a training run
to Slurm through submitit (:mod:`largedet.launch.slurm`); requeued on pre-emption and time-out,
it resumes from its last checkpoint by itself. The usage is ``tools/submit.py``'s (its
docstring, and docs/launching.md). The job runs ``python -m largedet.engine.train_net``, or
``python -m largedet_video.engine.train_net`` with ``--video``, so that it needs no checkout;
a LazyConfig (``.py``) runs ``tools/lazyconfig_train_net.py`` of a checkout."""

import argparse
import contextlib
import io
import os
import sys
from typing import Optional

from largedet.config.errors import error_lines
from largedet.config.imports import add_import_argument
from largedet.launch.slurm import CPUS_PER_GPU, SlurmResources, TrainingJob, submit
from largedet.model_zoo import resolve_config_file

#: the checkout holding this package, where there is one (an editable install)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: what a job runs for each kind of config (TrainingJob's ``script``)
SCRIPTS = {
    "yacs": "-m largedet.engine.train_net",
    "lazy": os.path.join(CHECKOUT, "tools", "lazyconfig_train_net.py"),
    "video": "-m largedet_video.engine.train_net",
}


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Submit a training run to Slurm through submitit; requeued on pre-emption and "
        "time-out, it resumes from its last checkpoint by itself (docs/launching.md).",
    )
    parser.add_argument(
        "--config", "--config-file", dest="config_file", metavar="FILE", default=None,
        type=resolve_config_file,
        help="the run's config: a file, or largedet's config of that name "
        "(shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml, video/...), as train_net.py takes it",
    )
    add_import_argument(parser)  # given to the script, which imports them on every node
    parser.add_argument("--video", action="store_true",
                        help="train the video project's models (projects/video/train.py)")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8,
                        help="GPUs per node, one training process each; 0: none (CPU processes)")  # fmt: skip
    parser.add_argument("--processes-per-node", type=int, default=0,
                        help="training processes per node (default: one per GPU, 1 without GPUs)")  # fmt: skip
    parser.add_argument("--cpus-per-gpu", type=int, default=0,
                        help=f"cores per training process (default: {CPUS_PER_GPU} with GPUs, 1 "
                        "with --gpus-per-node 0)")  # fmt: skip
    parser.add_argument("--srun", action="store_true",
                        help="one Slurm task per training process (srun), not one per node")  # fmt: skip
    parser.add_argument("--elastic", type=int, default=0, metavar="MIN",
                        help="elastic job: torchrun --nnodes MIN:NODES on each node, restarted on the "
                        "nodes left when one is lost (0: off)")  # fmt: skip
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="torchrun's --max-restarts of an --elastic job")  # fmt: skip
    parser.add_argument("--partition", default="", help="Slurm partition (default: the cluster's)")
    parser.add_argument("--account", default="", help="sbatch --account")
    parser.add_argument("--qos", default="", help="sbatch --qos")
    parser.add_argument("--constraint", default="", help="sbatch --constraint (node features)")
    parser.add_argument("--exclude", default="", help="sbatch --exclude (nodes not to use)")
    parser.add_argument("--sbatch", action="append", default=[], metavar="KEY[=VALUE]",
                        help="any other sbatch option, repeated: --sbatch mail-type=END "
                        "--sbatch exclusive (--KEY=VALUE, or --KEY without a value)")  # fmt: skip
    parser.add_argument("--no-data-check", action="store_true",
                        help="do not check the run's data files on this machine before submitting")  # fmt: skip
    parser.add_argument("--time", type=int, default=240, metavar="MINUTES",
                        help="time limit of each (re)queued run")  # fmt: skip
    parser.add_argument("--mem-gb", type=float, default=0, help="memory per node (0: the default)")
    parser.add_argument("--max-timeouts", type=int, default=20,
                        help="time-outs that requeue (pre-emptions requeue without limit)")  # fmt: skip
    parser.add_argument("--job-name", default="largedet")
    parser.add_argument("--job-dir", default="output/submitit/%j",
                        help="submitit's pickles and the job's logs (%%j: the job id)")  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="start from the last checkpoint")
    parser.add_argument("--local", action="store_true", help="run under submitit's local executor")
    parser.add_argument(
        "opts", nargs=argparse.REMAINDER, help="config overrides, as the script takes them"
    )
    return parser


def sbatch_options(items) -> dict:
    """``["mail-type=END", "exclusive"]`` -> ``{"mail-type": "END", "exclusive": True}``
    (submitit's ``slurm_additional_parameters``)."""
    options = {}
    for item in items:
        key, has_value, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key:
            raise ValueError(f"--sbatch {item!r}: no option name (KEY=VALUE or KEY)")
        options[key] = value if has_value else True
    return options


def check(kind: str, args: argparse.Namespace, processes: Optional[int] = None) -> None:
    """The script's own pre-launch check, for nodes x ``processes`` processes (default: the
    command line's per node; video: at job start)."""
    processes = processes or getattr(args, "processes_per_node", 0) or args.gpus_per_node or 1
    script_args = argparse.Namespace(
        config_file=args.config_file, opts=list(args.opts), imports=list(args.imports),
        eval_only=False, num_gpus=processes, num_machines=args.nodes,
        check_device=False,  # the GPUs are the compute nodes', not this machine's
        check_data=not getattr(args, "no_data_check", False),
    )  # fmt: skip
    if kind == "video":  # its config is checked at job start; its yaml tags here, as the others'
        from largedet.config.safe_yaml import check_config_tags

        check_config_tags(args.config_file)
    elif kind == "yacs":
        from largedet.engine.defaults import check_args

        check_args(script_args)
    elif kind == "lazy":
        from largedet.engine.lazy import check_lazy_args

        check_lazy_args(script_args)


def main() -> None:
    parser = argument_parser()
    args = parser.parse_args()
    if args.local and args.nodes != 1:
        parser.error("--local runs one node: --nodes 1")
    kind = "video" if args.video else "lazy" if (args.config_file or "").endswith(".py") else "yacs"
    if kind == "lazy" and not os.path.isfile(SCRIPTS["lazy"]):
        parser.error(f"a LazyConfig (.py) runs tools/lazyconfig_train_net.py of a checkout; none at {CHECKOUT}")
    if args.local and args.srun:
        parser.error("--srun needs Slurm: not with --local")
    if args.elastic and (args.local or args.srun):
        parser.error("--elastic runs torchrun on each Slurm node: not with --local or --srun")
    try:
        resources = SlurmResources(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, cpus_per_gpu=args.cpus_per_gpu,
            processes_per_node=args.processes_per_node, srun=args.srun,
            partition=args.partition, timeout_min=args.time, mem_gb=args.mem_gb,
            max_num_timeout=args.max_timeouts, name=args.job_name, account=args.account,
            qos=args.qos, constraint=args.constraint, exclude=args.exclude,
            sbatch=sbatch_options(args.sbatch), elastic_min_nodes=args.elastic,
            max_restarts=args.max_restarts,
        )  # fmt: skip
        # an elastic job runs on any node count from MIN to --nodes: each must split the batch
        for nodes in range(args.elastic or args.nodes, args.nodes + 1):
            check(kind, argparse.Namespace(**{**vars(args), "nodes": nodes}), resources.processes)
    except ValueError as e:  # ConfigError(s), BatchArithmeticError: one line per error, naming the key
        for line in error_lines(e):
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    if args.no_data_check:
        print("Data check skipped (--no-data-check): the job checks its files when it starts")
    job = TrainingJob(
        script=SCRIPTS[kind],
        gpus_per_node=resources.processes,
        config_file=os.path.abspath(args.config_file) if args.config_file else None,
        opts=list(args.opts),
        imports=list(args.imports),
        resume=args.resume,
    )
    # submitit prints sbatch's refusal itself, then raises it: printed once, here
    refusal = io.StringIO()
    try:
        with contextlib.redirect_stderr(refusal):
            submitted = submit(job, resources, args.job_dir, cluster="local" if args.local else "slurm")
    except (RuntimeError, ValueError) as e:  # submitit: no Slurm (no srun), sbatch refused
        message = " ".join(str(e).split()) or " ".join(refusal.getvalue().split())
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
    sys.stderr.write(refusal.getvalue())
    where = f"{args.gpus_per_node} GPU(s)" if args.gpus_per_node else "no GPU"
    print(f"Submitted job {submitted.job_id} ({args.nodes} node(s) x {resources.processes} "
          f"process(es), {where} per node{', one Slurm task each' if args.srun else ''}"
          f"{f', elastic down to {args.elastic} node(s)' if args.elastic else ''}); "
          f"logs: {submitted.paths.stdout.parent}")  # fmt: skip

