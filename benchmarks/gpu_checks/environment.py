"""The GPU machine's Python for the steps: what imports there, the wheels of what does not
(installed into a private folder on the children's PYTHONPATH, or fetched here for later),
and the children's environment."""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VIDEO_PROJECT = os.path.join(REPO, "projects", "video")

# Packages the steps import that a plain CUDA image may lack: (distribution, module it
# provides). sal-detectron2 is Detectron2 (see tools/install_detectron2.py): its wheel is
# tagged for CPython 3.10 and installed as such; its compiled extension does not load on
# another Python, which Faster and Mask R-CNN do not need.
DEVICE_PACKAGES = (
    ("sal-detectron2", "detectron2"),
    ("fvcore", "fvcore"),
    ("iopath", "iopath"),
    ("yacs", "yacs"),
    ("termcolor", "termcolor"),
    ("omegaconf", "omegaconf"),
    ("hydra-core", "hydra"),
    ("antlr4-python3-runtime", "antlr4"),
    ("pycocotools", "pycocotools"),
    ("av", "av"),
    ("setuptools", "pkg_resources"),
    ("portalocker", "portalocker"),
    ("tabulate", "tabulate"),
    ("cloudpickle", "cloudpickle"),
)
DETECTRON2_WHEEL_PYTHON = "3.10"
DETECTRON2_VERSION = "0.7.2"
# Modules every step needs, beside DEVICE_PACKAGES' (the image's own: torch and the rest).
BASE_MODULES = ("torch", "torchvision", "numpy", "cv2", "PIL", "yaml", "tqdm", "pytest")
PROJECT_MODULES = ("largedet", "largedet_video")


# --- the environment ------------------------------------------------------------------

# Run by the children's Python with their PYTHONPATH; argv[1]: the modules that must be
# there (found, not imported: importing them all takes seconds; the steps import them).
_PROBE = r"""
import importlib.metadata, importlib.util, json, os, platform, sys
info = {"python": platform.python_version(), "executable": sys.executable, "missing": {}}
for module in json.loads(sys.argv[1]):
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        found, info["missing"][module] = False, f"{type(e).__name__}: {e}"
    if not found:
        info["missing"].setdefault(module, "not found")
import torch
gpu = torch.cuda.is_available()
info.update(
    torch=torch.__version__, cuda=torch.version.cuda, cuda_available=gpu,
    cudnn=torch.backends.cudnn.version() if gpu else None,
    device=torch.cuda.get_device_name() if gpu else (platform.processor() or platform.machine()),
    device_count=torch.cuda.device_count(), cpu_count=os.cpu_count(),
)
if gpu:
    props = torch.cuda.get_device_properties(0)
    info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
versions = {}
for dist in ("torchvision", "numpy", "timm", "sal-detectron2", "fvcore", "av", "pytest"):
    try:
        versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        versions[dist] = None
info["versions"] = versions
if "largedet" not in info["missing"] and "detectron2" not in info["missing"]:
    try:
        import detectron2, largedet
        info["detectron2"] = os.path.dirname(detectron2.__file__)
        info["compiled_detectron2_ops"] = largedet.HAS_COMPILED_D2_OPS
    except Exception as e:
        info["missing"]["largedet"] = f"{type(e).__name__}: {e}"
print("GPU_CHECK_PROBE " + json.dumps(info))
"""


def child_env(site: Optional[str], dry_run: bool) -> Dict[str, str]:
    """The environment of every step: the repository, projects/video and the private site
    folder (where one was installed) first on PYTHONPATH; unbuffered output; on a dry run
    no GPU visible."""
    env = dict(os.environ)
    paths = ([site] if site and os.path.isdir(site) else []) + [REPO, VIDEO_PROJECT]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def probe(env: Dict[str, str]) -> Dict[str, Any]:
    modules = BASE_MODULES + tuple(m for _, m in DEVICE_PACKAGES) + PROJECT_MODULES
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(modules)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("GPU_CHECK_PROBE "):
            return json.loads(line[len("GPU_CHECK_PROBE ") :])
    return {"error": (proc.stdout + proc.stderr)[-4000:]}


def _wheel_distribution(path: str) -> str:
    return os.path.basename(path).split("-")[0].lower().replace("_", "-")


def install_wheels(wheels: str, site: str, missing: Sequence[str]) -> Dict[str, str]:
    """Install into ``site`` the wheels in ``wheels`` of the DEVICE_PACKAGES whose module is
    in ``missing``, one at a time (one that does not fit this Python does not stop the
    others); returns wheel file -> "installed" or pip's error."""
    wanted = {dist for dist, module in DEVICE_PACKAGES if module in missing}
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    pip += ["--no-compile", "--upgrade", "--target", site]
    outcome = {}
    for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        dist = _wheel_distribution(wheel)
        if dist not in wanted:
            continue
        if dist == "sal-detectron2":  # a CPython 3.10 wheel of Python files
            cmd = pip + ["--only-binary=:all:", "--python-version", DETECTRON2_WHEEL_PYTHON, wheel]
        else:
            cmd = pip + [wheel]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        outcome[os.path.basename(wheel)] = (
            "installed" if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()[-500:]
        )
    # sal-detectron2's stray top-level `tools` would shadow the repository's
    shutil.rmtree(os.path.join(site, "tools"), ignore_errors=True)
    return outcome


def set_up(args: argparse.Namespace) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """The children's environment and what the probe found in it, after installing what
    is missing from the wheel folder."""
    env = child_env(args.site, args.dry_run)
    info = probe(env)
    missing = sorted(info.get("missing", {}))
    if missing and os.path.isdir(args.wheels):
        print(
            f"Not importable: {', '.join(missing)}; installing from {args.wheels} into {args.site}"
        )
        installed = install_wheels(args.wheels, args.site, missing)
        for wheel, result in installed.items():
            print(f"  {wheel}: {result}")
        env = child_env(args.site, args.dry_run)
        info = probe(env)
        info["installed_wheels"] = installed
    return env, info


def fetch_wheels(folder: str, python_version: str) -> None:
    """Put the wheels of DEVICE_PACKAGES (this machine's versions) for CPython
    ``python_version`` on x86-64 Linux into ``folder``; a pure-Python package published only
    as source is built into a wheel here."""
    os.makedirs(folder, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    for dist, _ in DEVICE_PACKAGES:
        if dist == "sal-detectron2":
            spec, python = f"{dist}=={DETECTRON2_VERSION}", DETECTRON2_WHEEL_PYTHON
        else:
            spec, python = f"{dist}=={importlib.metadata.version(dist)}", python_version
        download = pip + ["download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", folder]
        download += ["--python-version", python, "--implementation", "cp"]
        if dist != "sal-detectron2":
            download += [arg for p in platforms for arg in ("--platform", p)]
        if subprocess.run(download + [spec], capture_output=True).returncode == 0:
            print(f"{spec}: downloaded")
            continue
        subprocess.run(pip + ["wheel", "--quiet", "--no-deps", "-w", folder, spec], check=True)
        print(f"{spec}: built from its source (no wheel published)")
    size = sum(os.path.getsize(w) for w in glob.glob(os.path.join(folder, "*.whl")))
    print(f"{folder}: {size / 2**20:.1f} MiB of wheels")


# --- running the steps ----------------------------------------------------------------
