"""Config files never run code: a yaml config (or one of its _BASE_ files) with a
``!!python/...`` tag is refused in one line naming the file and the tag, before its code
could run; ``--allow-python-yaml`` loads it, with a warning."""

import glob
import os
import subprocess
import sys

import pytest

from largedet.config.safe_yaml import PythonTagError, check_config_tags
from largedet.engine import largedet_argument_parser, setup_cfg

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


def _evil(tmp_path, marker):
    """A config whose OUTPUT_DIR, loaded with yaml.unsafe_load, creates ``marker``."""
    path = tmp_path / "evil.yaml"
    path.write_text(
        "SOLVER:\n  BASE_LR: 0.01\n"
        f"OUTPUT_DIR: !!python/object/apply:os.system [\"touch {marker}\"]\n"
    )
    return path


def test_a_python_tag_is_refused_naming_the_file_tag_and_line(tmp_path):
    marker = tmp_path / "ran"
    path = _evil(tmp_path, marker)
    with pytest.raises(PythonTagError) as refused:
        check_config_tags(str(path))
    assert str(refused.value).startswith(f"{path}: refusing the tag !!python/object/apply:os.system (line 3): ")
    assert "--allow-python-yaml" in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_python_tag_in_a_base_file_is_refused_naming_the_base(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "Base.yaml").write_text("SEED: !!python/name:os.getcwd\nVERSION: 2\n")
    top = tmp_path / "top.yaml"
    top.write_text("_BASE_: base/Base.yaml\nSOLVER:\n  BASE_LR: 0.01\n")
    with pytest.raises(PythonTagError, match=r"base/Base\.yaml: refusing the tag !!python/name:os\.getcwd \(line 1\)"):
        check_config_tags(str(top))


def test_train_net_refuses_it_in_one_line_before_launch(tmp_path):
    marker = tmp_path / "ran"
    path = _evil(tmp_path, marker)
    done = subprocess.run([sys.executable, TRAIN_NET, "--config", str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {path}: refusing the tag !!python/object/apply:os.system (line 3)")
    assert [x for x in lines if x.startswith("error:")] == [lines[-1]] and "Traceback" not in done.stderr
    assert not marker.exists() and done.stdout == ""


def test_allow_python_yaml_loads_it_with_a_warning(tmp_path):
    path = tmp_path / "tagged.yaml"
    path.write_text("SEED: !!python/object/apply:int [\"7\"]\nMODEL:\n  DEVICE: cpu\n")
    args = largedet_argument_parser().parse_args(["--config", str(path)])
    with pytest.raises(PythonTagError):
        setup_cfg(args, log=False)
    args = largedet_argument_parser().parse_args(["--config", str(path), "--allow-python-yaml"])
    assert setup_cfg(args, log=False).SEED == 7
    assert check_config_tags(str(path), allow_python_tags=True) == [
        f"{path}: loading !!python/object/apply:int (line 1) with yaml.unsafe_load (--allow-python-yaml): "
        "the file can run code"
    ]  # the warning logged


def test_every_config_of_the_repository_loads_safely():
    configs = glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    configs += glob.glob(os.path.join(ROOT, "projects", "video", "configs", "**", "*.yaml"), recursive=True)
    assert len(configs) > 10
    for path in configs:
        assert check_config_tags(path) == []


def test_the_merge_never_falls_back_to_the_unsafe_loader(tmp_path, monkeypatch):
    """A tag that the check does not see (here the check is switched off) fails to load as
    yaml instead of running: the merge uses the safe loader alone."""
    import largedet.config.safe_yaml as safe_yaml
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet.config.validate import ConfigError, merge_checked

    marker = tmp_path / "ran"
    path = _evil(tmp_path, marker)
    monkeypatch.setattr(safe_yaml, "_unsafe_tags", lambda node: [])
    with pytest.raises(ConfigError, match=r"evil\.yaml: not valid YAML: could not determine a constructor"):
        merge_checked(add_largedet_config(get_cfg()), str(path), [])
    assert not marker.exists()


def _tagged_text(marker):
    return f"OUTPUT_DIR: !!python/object/apply:os.system [\"touch {marker}\"]\n"


@pytest.mark.parametrize("loader", ["yacs", "lazy"])
def test_a_fifo_is_refused_without_reading_it(tmp_path, loader):
    """A FIFO (any file that is not a regular one) is refused on the open descriptor, in one
    line, and never waited on or read: what a writer would feed it never loads."""
    from largedet.config.errors import ConfigError
    from largedet.config.lazy import load_lazy_config
    from largedet.config.safe_yaml import load_yacs_config

    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    with pytest.raises(ConfigError) as refused:
        (load_yacs_config if loader == "yacs" else load_lazy_config)(str(path))
    assert str(refused.value) == f"{path}: is a FIFO, not a regular file: a config is read from a file"


@pytest.mark.parametrize("loader", ["yacs", "lazy", "check"])
def test_a_config_that_is_not_utf8_is_refused_under_any_locale(tmp_path, loader):
    """Latin-1 bytes (here in a comment, before a tag) are refused as not UTF-8 whatever the
    locale's encoding: the text that is checked is the text that would load."""
    from largedet.config.errors import ConfigError
    from largedet.config.lazy import load_lazy_config
    from largedet.config.safe_yaml import load_yacs_config

    marker = tmp_path / "ran"
    path = tmp_path / "latin1.yaml"
    path.write_bytes("# r\u00e9glages\n".encode("latin-1") + _tagged_text(marker).encode())
    load = {"yacs": load_yacs_config, "lazy": load_lazy_config, "check": check_config_tags}[loader]
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text \(byte 3 is 0xe9\)"):
        load(str(path))
    assert not marker.exists()


def test_a_fifo_lazy_config_ends_lazyconfig_train_net_in_one_line(tmp_path):
    """The LazyConfig script given a FIFO: one line, exit 2, no wait for a writer."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    script = os.path.join(ROOT, "tools", "lazyconfig_train_net.py")
    done = subprocess.run([sys.executable, script, "--config-file", str(fifo)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {fifo}: is a FIFO, not a regular file: a config is read from a file"
    )
    assert "Traceback" not in done.stderr


def test_a_latin1_lazy_config_under_a_latin1_locale_never_runs_its_tag(tmp_path, monkeypatch):
    """Under a locale whose encoding is latin-1 (here: text files opened without an encoding
    are read as latin-1), a LazyConfig yaml that is not UTF-8 is refused, not read with the
    locale's encoding by a loader that builds its tag."""
    import argparse
    import builtins

    from largedet.config.errors import ConfigError
    from largedet.config.lazy import setup_lazy_config

    opened = builtins.open

    def latin1_locale_open(file, mode="r", *args, **kwargs):
        if "b" not in mode and len(args) < 2 and kwargs.get("encoding") is None:
            kwargs["encoding"] = "latin-1"
        return opened(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", latin1_locale_open)
    marker = tmp_path / "ran"
    path = tmp_path / "latin1.yaml"
    path.write_bytes("# r\u00e9glages\n".encode("latin-1") + _tagged_text(marker).encode())
    args = argparse.Namespace(config_file=str(path), opts=[], allow_python_yaml=False)
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text"):
        setup_lazy_config(args, log=False)
    assert not marker.exists()


def test_the_text_that_is_checked_is_the_text_that_loads(tmp_path, monkeypatch):
    """The file is opened once: replacing it after the check (here: as soon as it has been
    read) changes nothing that loads."""
    import largedet.config.safe_yaml as safe_yaml

    marker = tmp_path / "ran"
    path = tmp_path / "swap.yaml"
    path.write_text("SEED: 3\n")
    read = safe_yaml.read_config_text

    def read_then_swap(p):
        text = read(p)
        path.write_text(_tagged_text(marker))
        return text

    monkeypatch.setattr(safe_yaml, "read_config_text", read_then_swap)
    assert safe_yaml.load_yacs_config(str(path)) == {"SEED": 3}
    assert not marker.exists()
