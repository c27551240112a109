"""A wheel built from the repository works outside the checkout: it holds the configs
(``largedet.model_zoo``), its console commands start, and ``largedet-train`` trains a few steps
of the shapes demo named by its config's name, from a folder that is not the checkout.

The wheel is built from a copy of the repository's files (``pip wheel --no-deps
--no-build-isolation``) and installed into a fresh virtual environment that sees the packages of
the interpreter running the tests (torch, Detectron2), where it must shadow the checkout's
editable install. That interpreter may be the system's, a venv's or a conda env's: a venv made
from a venv's Python is based on the *base* interpreter, so ``--system-site-packages`` would show
the base's packages, not the outer venv's. The new venv is made without it and a ``.pth`` file in
its site-packages adds the running interpreter's own site folders (``site.getsitepackages()`` and
the user site), their ``.pth`` files included, after the wheel's.
"""

import os
import site
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = "shapes/faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml"
# the files a wheel is built from
SOURCES = ("setup.py", "largedet/", "configs/", "projects/video/largedet_video/", "projects/video/configs/")


def _run(argv, cwd, env=None, timeout=300):
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{argv}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def site_folders():
    """The site folders of the running interpreter, in the order it searches them."""
    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        folders.append(site.getusersitepackages())
    return [f for f in folders if os.path.isdir(f)]


def see_outer_packages(venv):
    """Let ``venv`` see the running interpreter's packages after its own: a ``.pth`` file whose
    line adds each site folder with ``site.addsitedir`` (which reads that folder's ``.pth``
    files too, as the outer interpreter does)."""
    (own,) = (venv / "lib").glob("python*/site-packages")
    (own / "_outer_site.pth").write_text(
        # one line, run by site.addpackage with exec: no comprehension (its scope would not
        # see the name `site` bound on the same line)
        f"import site; list(map(site.addsitedir, {site_folders()!r}))\n"
    )


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """``(venv folder, its python, a working folder outside the checkout, environment)``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (its list of files) to build the wheel from")
    tmp = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    source = tmp / "source"
    for name in listed:
        if name.startswith(SOURCES) and (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", dist, source], cwd=tmp)  # fmt: skip
    (wheel,) = dist.glob("largedet-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    see_outer_packages(venv)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
         cwd=tmp)  # fmt: skip
    work = tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LARGEDET_DATASETS"] = str(tmp / "datasets")
    return venv, python, work, env


def test_the_wheel_holds_largedet_and_its_configs(installed_wheel):
    venv, python, work, env = installed_wheel
    out = _run([python, "-c", (
        "import largedet, largedet_video, largedet.model_zoo as z\n"
        "from largedet_video.engine import DEFAULT_CONFIG\n"
        "print(largedet.__file__); print(largedet_video.__file__)\n"
        f"print(z.get_config_file({DEMO!r})); print(DEFAULT_CONFIG)\n"
        "print(z.get_config_file('video/kinetics400_tsm_r50_8f.yaml'))\n"
        "print(z.get_config_file('configs/shapes/lazy/faster_rcnn_R18_FPN_pmdlamb_bs1024.py'))"
    )], cwd=work, env=env).stdout.split()  # fmt: skip
    site = next((venv / "lib").glob("python*/site-packages"))
    assert all(Path(p).is_relative_to(site) for p in out), out  # the wheel's, not the checkout's
    assert all(Path(p).is_file() for p in out), out
    assert out[2].endswith(f"largedet/model_zoo/configs/{DEMO}")
    assert out[3].endswith("largedet/model_zoo/configs/video/tsm_r18w32_8f_moving_shapes_adamw_bs16.yaml")
    for command in ("largedet-train", "largedet-video-train", "largedet-coco-eval", "largedet-submit",
                    "largedet-recipe"):
        assert "usage:" in _run([venv / "bin" / command, "--help"], cwd=work, env=env).stdout
    # the studies are experiments beside their runners, not the library: not in the wheel
    packages = {p.name for p in site.iterdir()}
    assert {"largedet", "largedet_video"} <= packages
    assert not {"largedet_study", "video_study"} & packages
    assert not (site / "largedet" / "study").exists()
    assert not list((site / "largedet_video").glob("study*"))


def test_the_video_default_config_passes_its_check_from_the_wheel(installed_wheel):
    venv, python, work, env = installed_wheel
    _run([python, "-c", (
        "import argparse\n"
        "from largedet_video.engine.checks import check_video_args\n"
        "check_video_args(argparse.Namespace(config_file=None, opts=['MODEL.DEVICE', 'cpu'], "
        "eval_only=False, resume=False, num_gpus=1, num_machines=1))"
    )], cwd=work, env=env)  # fmt: skip


def test_largedet_train_trains_from_outside_the_checkout(installed_wheel):
    venv, python, work, env = installed_wheel
    result = _run([
        venv / "bin" / "largedet-train", "--config", DEMO, "MODEL.DEVICE", "cpu",
        "DATASETS.TEST", "()", "DATASETS.SHAPES.NUM_TRAIN", "16", "DATASETS.SHAPES.NUM_VAL", "4",
        "SOLVER.MAX_ITER", "2", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.IMS_PER_DEVICE", "2",
        "SOLVER.WARMUP_ITERS", "1", "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64",
        "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", "run",
    ], cwd=work, env=env)  # fmt: skip
    assert (work / "run" / "model_final.pth").is_file(), result.stdout + result.stderr
    assert f"{ROOT}{os.sep}" not in (work / "run" / "config.yaml").read_text()  # no path into the checkout


def test_largedet_submit_runs_a_job_from_outside_the_checkout(installed_wheel):
    """The wheel's largedet-submit under submitit's local executor: the job runs
    ``python -m largedet.engine.train_net`` of the wheel, no checkout needed."""
    venv, python, work, env = installed_wheel
    result = _run([
        venv / "bin" / "largedet-submit", "--local", "--gpus-per-node", "0", "--job-dir", "jobs/%j",
        "--config", DEMO, "MODEL.DEVICE", "cpu", "DATASETS.TEST", "()", "DATASETS.SHAPES.NUM_TRAIN", "16",
        "DATASETS.SHAPES.NUM_VAL", "4", "SOLVER.MAX_ITER", "2", "SOLVER.IMS_PER_BATCH", "2",
        "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.WARMUP_ITERS", "1", "INPUT.MIN_SIZE_TRAIN", "(64,)",
        "INPUT.MAX_SIZE_TRAIN", "64", "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", "submitted",
    ], cwd=work, env=env)  # fmt: skip
    assert "Submitted job" in result.stdout
    deadline = time.monotonic() + 300
    while not (work / "submitted" / "model_final.pth").is_file():
        assert time.monotonic() < deadline, "".join(p.read_text() for p in (work / "jobs").rglob("*_log.*"))
        time.sleep(1)
    job_log = "".join(p.read_text() for p in (work / "jobs").rglob("*_log.*"))
    assert "-m largedet.engine.train_net" in job_log and f"{ROOT}{os.sep}" not in job_log
