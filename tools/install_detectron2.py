#!/usr/bin/env python3
"""Put Detectron2 on this Python when it has none, never beside or over another one.

Detectron2 is not on the package registry under its own name. Where no Detectron2
is installed, this installs the registry package ``sal-detectron2==0.7.2`` (a build
of Detectron2's main branch whose wheel is tagged for CPython 3.10 but whose Python
code runs on newer versions) into a folder of its own beside site-packages
(``largedet_detectron2``), made importable by a ``.pth`` file
(``largedet-detectron2.pth``). The wheel's stray top-level ``tools`` package is
removed so it cannot shadow anyone's ``tools``.

What is already there decides, as a fresh interpreter sees it:

- an installed distribution that provides the top-level package ``detectron2``
  (a pip install, an editable install, a build from source), other than
  largedet's copy: left as it is when ``import detectron2`` finds it; otherwise
  (it does not import, or largedet's copy hides it) nothing is installed and the
  script fails with a one-line message naming it;
- a ``detectron2`` package without metadata (a source tree on ``PYTHONPATH``):
  the same;
- largedet's copy: left as it is (``--force`` reinstalls it);
- nothing: largedet's copy is installed.

``--uninstall`` removes largedet's copy and its ``.pth`` file, and nothing else.
Uses only the standard library, so it runs before anything else is set up.

    python tools/install_detectron2.py [--force | --uninstall] [--wheel FILE] [--site-packages DIR]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

PACKAGE = "sal-detectron2==0.7.2"
WHEEL_PYTHON = "3.10"
TARGET_NAME = "largedet_detectron2"
PTH_NAME = "largedet-detectron2.pth"

# Run in a fresh interpreter (argv[1]: the site-packages folder, added as a site
# directory if it is not one already): every distribution providing the top-level
# package detectron2, where `import detectron2` finds it, and whether it imports.
_PROBE = r"""
import importlib.metadata, importlib.util, json, os, site, sys

if sys.path and sys.path[0] == "":
    sys.path.pop(0)  # what is installed, not what lies in the working directory
if os.path.realpath(sys.argv[1]) not in {os.path.realpath(p) for p in sys.path}:
    site.addsitedir(sys.argv[1])


def provides_detectron2(dist):
    if (dist.metadata["Name"] or "").lower() == "detectron2":
        return True
    if "detectron2" in (dist.read_text("top_level.txt") or "").split():
        return True
    return any(f.parts and f.parts[0] == "detectron2" for f in dist.files or ())


def editable_source(dist):
    try:
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    if not direct_url.get("dir_info", {}).get("editable"):
        return None
    url = direct_url.get("url", "")
    return url[len("file://"):] if url.startswith("file://") else url


dists, seen = [], set()
for dist in importlib.metadata.distributions():
    location = os.path.realpath(str(dist.locate_file("")))
    key = ((dist.metadata["Name"] or "").lower(), location)
    if key in seen or not provides_detectron2(dist):
        continue
    seen.add(key)
    dists.append(dict(name=dist.metadata["Name"], version=dist.version, location=location,
                      editable_source=editable_source(dist)))

spec = importlib.util.find_spec("detectron2")
found_at = None
if spec is not None and spec.submodule_search_locations:
    found_at = os.path.realpath(list(spec.submodule_search_locations)[0])
error = None
try:
    import detectron2
except Exception as e:
    error = (type(e).__name__ + ": " + str(e)).splitlines()[0]
print(json.dumps(dict(dists=dists, found_at=found_at, error=error)))
"""


@dataclass(frozen=True)
class Distribution:
    """An installed distribution that provides the top-level package ``detectron2``."""

    name: str
    version: str
    location: str
    editable_source: str | None = None

    def __str__(self) -> str:
        where = f"editable install of {self.editable_source}" if self.editable_source else f"in {self.location}"
        return f"{self.name} {self.version} ({where})"


@dataclass(frozen=True)
class Detectron2State:
    """What a fresh interpreter sees: the distributions, the folder ``import detectron2`` finds
    (None: none), and the import's error (None: it imports)."""

    dists: list[Distribution]
    found_at: str | None
    error: str | None


def probe(site_packages: str) -> Detectron2State:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, site_packages], capture_output=True, text=True, check=True
    )
    state = json.loads(out.stdout)
    return Detectron2State([Distribution(**d) for d in state["dists"]], state["found_at"], state["error"])


def _inside(path: str, folder: str) -> bool:
    folder = os.path.realpath(folder)
    return path == folder or path.startswith(folder + os.sep)


def _refuse(message: str) -> int:
    print(f"error: {message}; largedet installs no second Detectron2 beside it.", file=sys.stderr)
    return 1


def check_existing(state: Detectron2State, target: str, force: bool) -> int | None:
    """The exit status if a Detectron2 other than largedet's copy decides, else None.

    A foreign Detectron2 is never shadowed nor duplicated: where it imports it is left as it
    is; where it does not, or largedet's copy hides it, the script refuses, naming it.
    """
    foreign = [d for d in state.dists if not _inside(d.location, target)]
    found_ours = state.found_at is not None and _inside(state.found_at, target)
    if foreign:
        other = foreign[0]
        if found_ours:
            return _refuse(f"Detectron2 is installed as {other}, but largedet's copy in {target} "
                           "hides it. Remove the copy with --uninstall")
        if state.error is not None:
            return _refuse(f"Detectron2 is installed as {other}, but it does not import ({state.error}). "
                           f"Fix or uninstall it (python -m pip uninstall {other.name})")
        unused = f" (largedet's copy in {target} is unused: --uninstall removes it)"
        print(f"Detectron2 found at {state.found_at}, installed as {other}; leaving it as it "
              f"is{unused if os.path.isdir(target) else ''}.")
        return 0
    if state.found_at is not None and not found_ours:  # a source tree without package metadata
        if state.error is None:
            print(f"Detectron2 found at {state.found_at}; leaving it as it is.")
            return 0
        return _refuse(f"Detectron2 at {state.found_at} does not import ({state.error})")
    if found_ours and state.error is None and not force:
        print(f"largedet's copy of Detectron2 found at {state.found_at}; leaving it as it is "
              "(--force reinstalls it).")
        return 0
    return None


def install(site_packages: str, target: str, wheel: str | None) -> None:
    """pip's cross-install of the 3.10 wheel into ``target``, without its ``tools`` package,
    and the ``.pth`` file that puts ``target`` on the path."""
    if os.path.isdir(target):
        shutil.rmtree(target)
    source = ["--no-index", os.path.abspath(wheel)] if wheel else [PACKAGE]
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", WHEEL_PYTHON,
        "--target", target, *source,
    ]  # fmt: skip
    print("Installing Detectron2:", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)
    stray_tools = os.path.join(target, "tools")
    if os.path.isdir(stray_tools):
        shutil.rmtree(stray_tools)
    with open(os.path.join(site_packages, PTH_NAME), "w") as f:
        f.write(target + "\n")


def uninstall(site_packages: str, target: str) -> int:
    """Remove largedet's copy and its ``.pth`` file; nothing else."""
    removed = []
    pth = os.path.join(site_packages, PTH_NAME)
    if os.path.isfile(pth):
        os.remove(pth)
        removed.append(pth)
    if os.path.isdir(target):
        shutil.rmtree(target)
        removed.append(target)
    print("Removed " + " and ".join(removed) if removed else "largedet's copy of Detectron2 is not installed.")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--force", action="store_true", help="reinstall largedet's copy")
    action.add_argument("--uninstall", action="store_true", help="remove largedet's copy and its .pth file")
    parser.add_argument(
        "--wheel", metavar="FILE",
        help=f"install this wheel file instead of {PACKAGE} from the package registry (offline)",
    )  # fmt: skip
    parser.add_argument(
        "--site-packages", metavar="DIR", default=sysconfig.get_paths()["purelib"],
        help="the site-packages folder that gets the copy and its .pth file (default: this Python's)",
    )  # fmt: skip
    args = parser.parse_args()

    site_packages = os.path.realpath(args.site_packages)
    target = os.path.join(site_packages, TARGET_NAME)
    if args.uninstall:
        return uninstall(site_packages, target)
    status = check_existing(probe(site_packages), target, args.force)
    if status is not None:
        return status

    install(site_packages, target, args.wheel)
    state = probe(site_packages)
    if state.error is not None or state.found_at is None or not _inside(state.found_at, target):
        reason = state.error or f"import detectron2 finds {state.found_at}"
        print(f"error: Detectron2 was installed into {target} but does not import ({reason})", file=sys.stderr)
        return 1
    print(f"Detectron2 installed at {state.found_at}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
