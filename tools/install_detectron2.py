#!/usr/bin/env python3
"""Put Detectron2 on this Python when it has none.

Detectron2 is not on the package registry under its own name. Where
``import detectron2`` fails, this installs the registry package
``sal-detectron2==0.7.2`` (a build of Detectron2's main branch whose wheel is
tagged for CPython 3.10 but whose Python code runs on newer versions) into a
folder of its own beside site-packages, made importable by a ``.pth`` file. The
wheel's stray top-level ``tools`` package is removed so it cannot shadow anyone's
``tools``. Its compiled extension is replaced at import time by largedet's
fallback (``largedet.utils.d2_compat``).

Where Detectron2 already imports (for example a build from source), nothing is
done. Uses only the standard library, so it runs before anything else is set up.

    python tools/install_detectron2.py [--force]
"""

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig

PACKAGE = "sal-detectron2==0.7.2"
WHEEL_PYTHON = "3.10"
TARGET_NAME = "largedet_detectron2"
PTH_NAME = "largedet-detectron2.pth"


def detectron2_location():
    """Where a fresh interpreter finds Detectron2, or None."""
    probe = "import detectron2, os; print(os.path.dirname(detectron2.__file__))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="reinstall largedet's copy")
    args = parser.parse_args()

    site_packages = sysconfig.get_paths()["purelib"]
    target = os.path.join(site_packages, TARGET_NAME)
    found = detectron2_location()
    if found and not args.force:
        print(f"Detectron2 found at {found}; leaving it as it is.")
        return 0
    if found and not found.startswith(target):
        print(f"Detectron2 at {found} is not largedet's copy; --force does not replace it.")
        return 0

    if os.path.isdir(target):
        shutil.rmtree(target)
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", WHEEL_PYTHON,
        "--target", target, PACKAGE,
    ]
    print("Installing Detectron2:", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)
    stray_tools = os.path.join(target, "tools")
    if os.path.isdir(stray_tools):
        shutil.rmtree(stray_tools)
    with open(os.path.join(site_packages, PTH_NAME), "w") as f:
        f.write(target + "\n")

    found = detectron2_location()
    if not found:
        print(f"error: Detectron2 was installed into {target} but does not import", file=sys.stderr)
        return 1
    print(f"Detectron2 installed at {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
