"""tools/submit.py against a stand-in sbatch (no Slurm here): a config given by name as
train_net.py takes it, the cores a CPU-only job asks for, and sbatch's refusal in one line."""

import os
import stat
import subprocess
import sys

import pytest

pytest.importorskip("submitit")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SUBMIT = os.path.join(ROOT, "tools", "submit.py")
CONFIG_NAME = "shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml"
REFUSAL = "sbatch: error: Batch job submission failed: Requested node configuration is not available"


def stand_in_slurm(bin_dir, refuse: bool):
    """``sbatch`` that copies the submission file it is given to ``bin_dir/submitted.sh`` and
    accepts it as job 4242, or refuses it as Slurm does; ``srun``, for submitit to see a
    Slurm cluster."""
    bin_dir.mkdir()
    sbatch = f'cp "$1" {bin_dir}/submitted.sh\n' + (
        f'echo "{REFUSAL}" >&2\nexit 1\n' if refuse else 'echo "Submitted batch job 4242"\n'
    )
    for name, body in (("sbatch", sbatch), ("srun", "exit 0\n")):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_submit(tmp_path, refuse, *args):
    bin_dir = tmp_path / "bin"
    stand_in_slurm(bin_dir, refuse)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               LARGEDET_DATASETS=str(tmp_path / "datasets"))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, SUBMIT, "--job-dir", str(tmp_path / "jobs" / "%j"), "--no-data-check", *args],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    sbatch_file = bin_dir / "submitted.sh"
    return proc, (sbatch_file.read_text().splitlines() if sbatch_file.exists() else None)


def test_a_config_by_name_on_a_cpu_only_node(tmp_path):
    # from another folder: the name is found among largedet's configs, as train_net.py finds it
    proc, sbatch = run_submit(tmp_path, False, "--gpus-per-node", "0", "--processes-per-node", "2",
                              "--config", CONFIG_NAME)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Submitted job 4242 (1 node(s) x 2 process(es), no GPU per node)" in proc.stdout
    # one core per process, not the GPU nodes' 10, and no gres
    assert "#SBATCH --cpus-per-task=2" in sbatch
    assert not [line for line in sbatch if "gpu" in line]
    config = os.path.abspath(os.path.join(ROOT, "configs", CONFIG_NAME))
    job = open(tmp_path / "jobs" / "4242" / "4242_submitted.pkl", "rb").read()
    assert config.encode() in job  # the job runs the resolved file


def test_gpu_nodes_keep_ten_cores_per_gpu_and_a_given_number_is_used(tmp_path):
    for name, args, cores in (("gpus", ("--gpus-per-node", "2"), 20),
                              ("given", ("--gpus-per-node", "0", "--cpus-per-gpu", "4"), 4)):  # fmt: skip
        (tmp_path / name).mkdir()
        proc, sbatch = run_submit(tmp_path / name, False, *args, "--config", CONFIG_NAME)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"#SBATCH --cpus-per-task={cores}" in sbatch


def test_sbatch_refusal_is_one_line(tmp_path):
    proc, sbatch = run_submit(tmp_path, True, "--gpus-per-node", "0", "--config", CONFIG_NAME)
    assert proc.returncode == 1
    assert sbatch is not None  # sbatch was asked
    assert proc.stderr.count("Requested node configuration is not available") == 1, proc.stderr
    assert f"error: {REFUSAL}" in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
