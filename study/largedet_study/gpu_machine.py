"""A lent GPU machine's Python for the study's cells: which of the modules the cells import
do not import there, those installed from a folder of wheels into a private folder, and the
cells' environment with that folder on PYTHONPATH."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Tuple

__all__ = ["CELL_PACKAGES", "prepare_machine"]

#: (distribution, module): what a cell imports beside the image's own (torch, torchvision,
#: numpy, OpenCV, Pillow, PyYAML, tqdm) that a plain CUDA image may lack. sal-detectron2 is Detectron2
#: (tools/install_detectron2.py), a CPython 3.10 wheel of Python files.
CELL_PACKAGES = (
    ("sal-detectron2", "detectron2"), ("fvcore", "fvcore"), ("iopath", "iopath"),
    ("yacs", "yacs"), ("termcolor", "termcolor"), ("omegaconf", "omegaconf"),
    ("hydra-core", "hydra"), ("antlr4-python3-runtime", "antlr4"),
    ("pycocotools", "pycocotools"), ("setuptools", "pkg_resources"),
    ("portalocker", "portalocker"), ("tabulate", "tabulate"), ("cloudpickle", "cloudpickle"),
)  # fmt: skip
_IMAGE_MODULES = ("torch", "torchvision", "numpy", "cv2", "PIL", "yaml", "tqdm", "largedet")

# Run by the cells' Python with their PYTHONPATH; argv[1]: the modules to find (not import).
_PROBE = r"""
import importlib.util, json, sys
missing = []
for module in json.loads(sys.argv[1]):
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(module)
info = {"python": sys.version.split()[0], "missing": missing, "device": None}
if "torch" not in missing:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda)
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
print("STUDY_PROBE " + json.dumps(info))
"""


def _cell_env(repo: str, site: str) -> Dict[str, str]:
    paths = ([site] if os.path.isdir(site) else []) + [repo, os.path.join(repo, "projects", "video")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _probe(repo: str, env: Dict[str, str]) -> Dict[str, Any]:
    modules = _IMAGE_MODULES + tuple(module for _, module in CELL_PACKAGES)
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], cwd=repo, env=env,
                          capture_output=True, text=True)  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("STUDY_PROBE "):
            return json.loads(line[len("STUDY_PROBE ") :])
    return {"missing": ["python"], "device": None, "error": (proc.stdout + proc.stderr)[-2000:]}


def _install(wheels: str, site: str, missing: List[str]) -> Dict[str, str]:
    """pip's outcome per wheel of ``wheels`` whose module is ``missing``, each installed alone
    into ``site``."""
    wanted = {dist for dist, module in CELL_PACKAGES if module in missing}
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--upgrade", "--target", site]  # fmt: skip
    outcome = {}
    for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        dist = os.path.basename(wheel).split("-")[0].lower().replace("_", "-")
        if dist not in wanted:
            continue
        extra = ["--only-binary=:all:", "--python-version", "3.10"] if dist == "sal-detectron2" else []
        proc = subprocess.run(pip + extra + [wheel], capture_output=True, text=True)
        outcome[os.path.basename(wheel)] = "installed" if proc.returncode == 0 else proc.stderr[-300:]
    # sal-detectron2's stray top-level `tools` would shadow the repository's
    shutil.rmtree(os.path.join(site, "tools"), ignore_errors=True)
    return outcome


def prepare_machine(repo: str, site: str, wheels: str) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """The cells' environment (``site``, the repository ``repo`` and its ``projects/video``
    first on PYTHONPATH) and what a probe found in it (``missing``: the modules that do not
    import; ``device``: the GPU's name, None without one), after installing from ``wheels``
    what did not import."""
    env = _cell_env(repo, site)
    info = _probe(repo, env)
    if info["missing"] and os.path.isdir(wheels):
        installed = _install(wheels, site, info["missing"])
        env = _cell_env(repo, site)
        info = dict(_probe(repo, env), installed_wheels=installed)
    return env, info
