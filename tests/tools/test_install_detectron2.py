"""The install route (``make setup``): tools/install_detectron2.py installs largedet's copy of
Detectron2 only where there is none, never beside or over another one, and removes only its
own copy; ``make setup`` adds OpenCV only where none is installed.

Everything runs in a throwaway virtual environment without network: pip is lent from this
Python, the registry wheel is replaced by a tiny local one, other Detectron2 installs are
stand-ins (a dist-info folder and a package).
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLER = os.path.join(REPO, "tools", "install_detectron2.py")
BROKEN = "raise ImportError(\"No module named 'fvcore'\")\n"


class Venv:
    """A bare virtual environment (``python -m venv --without-pip``) that can run pip."""

    def __init__(self, root):
        self.root = root
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        self.python = str(root / "venv" / "bin" / "python")
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site_packages = subprocess.run(
            [self.python, "-c", purelib], capture_output=True, text=True, check=True
        ).stdout.strip()
        lent = root / "lent_pip"
        lent.mkdir()
        import pip

        os.symlink(os.path.dirname(pip.__file__), lent / "pip")
        with open(os.path.join(self.site_packages, "lent-pip.pth"), "w") as f:
            f.write(f"{lent}\n")
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"
        }
        self.env.update(
            PYTHONNOUSERSITE="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
            PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull,
        )  # fmt: skip

    @property
    def copy(self) -> str:
        return os.path.join(self.site_packages, "largedet_detectron2")

    @property
    def pth(self) -> str:
        return os.path.join(self.site_packages, "largedet-detectron2.pth")

    def run(self, *args, env=None, cwd=REPO):
        return subprocess.run(
            list(args), capture_output=True, text=True, env={**self.env, **(env or {})}, cwd=cwd
        )

    def install(self, *flags, env=None):
        return self.run(self.python, INSTALLER, *flags, env=env)

    def detectron2_location(self, env=None):
        out = self.run(self.python, "-c", "import detectron2; print(detectron2.__file__)", env=env)
        return out.stdout.strip() if out.returncode == 0 else None

    def add_distribution(self, name, version, package_dir=None, editable_source=None, pth=None):
        """A stand-in of an installed distribution providing ``detectron2``: its dist-info
        folder, the package in ``package_dir`` (if any), and a ``.pth`` file ``pth`` putting
        ``editable_source`` on the path (an editable install)."""
        info = os.path.join(self.site_packages, f"{name}-{version}.dist-info")
        os.makedirs(info)
        _write(os.path.join(info, "METADATA"), f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        _write(os.path.join(info, "top_level.txt"), "detectron2\n")
        if editable_source:
            url = {"url": f"file://{editable_source}", "dir_info": {"editable": True}}
            _write(os.path.join(info, "direct_url.json"), json.dumps(url))
            _write(os.path.join(self.site_packages, pth), f"{editable_source}\n")
        if package_dir:
            shutil.copytree(package_dir, os.path.join(self.site_packages, "detectron2"))


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _package(folder, init):
    """A ``detectron2`` package in ``folder`` whose ``__init__.py`` is ``init``; returns it."""
    _write(os.path.join(folder, "detectron2", "__init__.py"), init)
    return os.path.join(folder, "detectron2")


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


@pytest.fixture
def venv(tmp_path):
    return Venv(tmp_path)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A tiny stand-in of the registry wheel: ``detectron2`` and the stray ``tools`` package."""
    info = "sal_detectron2-0.7.2.dist-info"
    files = {
        "detectron2/__init__.py": "__version__ = '0.7.2'\n",
        "tools/__init__.py": "",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: sal-detectron2\nVersion: 0.7.2\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": "detectron2\ntools\n",
    }
    path = tmp_path_factory.mktemp("wheel") / "sal_detectron2-0.7.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        record = []
        for name, text in files.items():
            zf.writestr(name, text)
            record.append(_record_line(name, text.encode()))
        zf.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return str(path)


def test_installs_where_there_is_none_and_uninstalls(venv, wheel):
    out = venv.install("--wheel", wheel)
    assert out.returncode == 0, out.stderr
    assert venv.detectron2_location() == os.path.join(venv.copy, "detectron2", "__init__.py")
    assert not os.path.exists(os.path.join(venv.copy, "tools"))  # the wheel's stray package
    with open(venv.pth) as f:
        assert f.read() == venv.copy + "\n"

    again = venv.install("--wheel", wheel)
    assert again.returncode == 0 and "largedet's copy of Detectron2 found" in again.stdout

    out = venv.install("--uninstall")
    assert out.returncode == 0 and "Removed" in out.stdout
    assert not os.path.exists(venv.copy) and not os.path.exists(venv.pth)
    assert venv.detectron2_location() is None
    again = venv.install("--uninstall")
    assert again.returncode == 0 and "not installed" in again.stdout


def test_leaves_a_working_install_alone(venv, wheel, tmp_path):
    venv.add_distribution("detectron2", "0.6", package_dir=_package(tmp_path / "src", ""))
    for flags in ((), ("--force",)):
        out = venv.install("--wheel", wheel, *flags)
        assert out.returncode == 0, out.stderr
        assert "installed as detectron2 0.6" in out.stdout
    assert not os.path.exists(venv.copy) and not os.path.exists(venv.pth)


def test_refuses_beside_an_install_that_does_not_import(venv, wheel, tmp_path):
    venv.add_distribution("detectron2", "0.6", package_dir=_package(tmp_path / "src", BROKEN))
    out = venv.install("--wheel", wheel)
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert f"detectron2 0.6 (in {os.path.realpath(venv.site_packages)})" in line
    assert "does not import (ImportError: No module named 'fvcore')" in line
    assert "pip uninstall detectron2" in line
    assert not os.path.exists(venv.copy) and not os.path.exists(venv.pth)


def test_refuses_beside_an_editable_install_that_does_not_import(venv, wheel, tmp_path):
    source = tmp_path / "detectron2_checkout"
    _package(source, BROKEN)
    venv.add_distribution("detectron2", "0.6", editable_source=str(source), pth="__editable__.detectron2-0.6.pth")
    out = venv.install("--wheel", wheel)
    assert out.returncode == 1
    assert f"detectron2 0.6 (editable install of {source})" in out.stderr
    assert not os.path.exists(venv.copy)


def test_refuses_while_its_copy_hides_another_until_uninstalled(venv, wheel, tmp_path):
    """An older install route put largedet's copy first on the path, before the user's own
    Detectron2 (here an editable install whose .pth file sorts after largedet's)."""
    assert venv.install("--wheel", wheel).returncode == 0
    source = tmp_path / "detectron2_checkout"
    _package(source, "")
    venv.add_distribution("detectron2", "0.6", editable_source=str(source), pth="zz-detectron2.pth")
    assert venv.detectron2_location().startswith(venv.copy)

    out = venv.install("--wheel", wheel)
    assert out.returncode == 1
    assert "largedet's copy" in out.stderr and "hides it" in out.stderr and "--uninstall" in out.stderr
    assert venv.install("--uninstall").returncode == 0
    assert venv.detectron2_location() == str(source / "detectron2" / "__init__.py")
    out = venv.install("--wheel", wheel)
    assert out.returncode == 0 and "editable install of" in out.stdout
    assert not os.path.exists(venv.copy)


@pytest.mark.parametrize("init, status", [("", 0), (BROKEN, 1)])
def test_a_source_tree_without_metadata_decides_too(venv, wheel, tmp_path, init, status):
    _package(tmp_path / "checkout", init)
    out = venv.install("--wheel", wheel, env={"PYTHONPATH": str(tmp_path / "checkout")})
    assert out.returncode == status, out.stderr
    assert os.path.realpath(tmp_path / "checkout" / "detectron2") in out.stdout + out.stderr
    assert not os.path.exists(venv.copy)


def test_installs_into_another_site_packages_folder(venv, wheel, tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    out = venv.install("--wheel", wheel, "--site-packages", str(site_dir))
    assert out.returncode == 0, out.stderr
    assert (site_dir / "largedet-detectron2.pth").read_text() == f"{site_dir / 'largedet_detectron2'}\n"
    find = f"import site; site.addsitedir({str(site_dir)!r}); import detectron2; print(detectron2.__file__)"
    located = venv.run(venv.python, "-c", find).stdout.strip()
    assert located == str(site_dir / "largedet_detectron2" / "detectron2" / "__init__.py")
    assert not os.path.exists(venv.copy) and venv.detectron2_location() is None


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_setup_adds_opencv_only_where_there_is_none(venv, tmp_path):
    """``make setup`` with pip replaced by ``echo``: the largedet install it would run."""
    venv.add_distribution("detectron2", "0.6", package_dir=_package(tmp_path / "src", ""))

    def planned_install():
        out = venv.run("make", "-s", "setup", f"PYTHON={venv.python}", "PIP=echo pip")
        assert out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if line.startswith("pip install --quiet -e")]
        return line

    assert planned_install() == "pip install --quiet -e .[test,opencv]"
    info = os.path.join(venv.site_packages, "opencv_python-4.10.0.84.dist-info")
    _write(os.path.join(info, "METADATA"), "Metadata-Version: 2.1\nName: opencv-python\nVersion: 4.10.0.84\n")
    assert planned_install() == "pip install --quiet -e .[test]"
