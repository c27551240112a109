"""largedet.config.imports and the training scripts' command line: the run's modules are
the config's then --import's, each once; a name that is not a module name, and a module that
fails to import, are one line; the working directory is searched; flags may follow the
trailing KEY VALUE overrides."""

import argparse
import sys

import pytest

from largedet.config.errors import ConfigError
from largedet.config.imports import import_modules, import_run_modules, imports_of
from largedet.engine import largedet_argument_parser


def test_the_runs_modules_are_the_configs_then_the_flags_each_once():
    args = argparse.Namespace(imports=["b", "a", "c", "c"])
    assert imports_of(["a"], args) == ("a", "b", "c")
    assert imports_of([], argparse.Namespace()) == ()  # a script without the flag


@pytest.mark.parametrize("name", ["my-ext", "my ext", "", "a..b", 3])
def test_a_name_that_is_not_a_module_name_is_refused(name):
    with pytest.raises(ConfigError, match=r"^IMPORTS: .* is not a module name \(such as my_ext or my\.ext\)$"):
        import_modules([name], "IMPORTS")


def test_modules_are_found_in_the_working_directory_and_their_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "cwd_ext_ok.py").write_text("VALUE = 1\n")
    (tmp_path / "cwd_ext_bad.py").write_text("import cwd_ext_missing_dependency\n")
    modules = import_run_modules(["cwd_ext_ok"], argparse.Namespace(imports=[]))
    assert modules == ("cwd_ext_ok",) and sys.modules["cwd_ext_ok"].VALUE == 1
    with pytest.raises(ConfigError) as e:
        import_run_modules([], argparse.Namespace(imports=["cwd_ext_bad"]))
    message = str(e.value)
    # a dependency the module imports is not found: the module's own line is named
    assert message == (
        "--import cwd_ext_bad: ModuleNotFoundError: No module named 'cwd_ext_missing_dependency' "
        f"({tmp_path / 'cwd_ext_bad.py'}:1)"
    )
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"^IMPORTS cwd_ext_ok\.py: ModuleNotFoundError: .* \(searched: "
                                          r"sys\.path and the working directory .*\); a module's name has no \.py$"):
        import_modules(["cwd_ext_ok.py"], "IMPORTS")


def test_flags_may_follow_the_overrides_but_not_stand_for_values():
    parse = largedet_argument_parser().parse_args
    args = parse(["--import", "a", "SOLVER.MAX_ITER", "10", "--num-gpus", "2", "--import", "b", "SEED", "1"])
    assert (args.num_gpus, args.imports, args.opts) == (2, ["a", "b"], ["SOLVER.MAX_ITER", "10", "SEED", "1"])
    # a flag in a value's place is the value; an unknown one stays an override (refused as a key)
    assert parse(["OUTPUT_DIR", "--resume"]).opts == ["OUTPUT_DIR", "--resume"]
    assert parse(["SEED", "1", "--no-such-flag", "1"]).opts == ["SEED", "1", "--no-such-flag", "1"]


def test_a_lazyconfig_lists_its_modules_in_train_imports(tmp_path, monkeypatch):
    import os

    from largedet.config.lazy import run_config, setup_lazy_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lazy_ext_ok.py").write_text("VALUE = 2\n")
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "shapes", "lazy",
                          "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")  # fmt: skip
    args = argparse.Namespace(config_file=config, opts=["train.imports=['lazy_ext_ok']"], imports=["lazy_ext_ok"])
    cfg = setup_lazy_config(args, log=False)
    assert list(cfg.train.imports) == ["lazy_ext_ok"] and run_config(cfg).IMPORTS == ["lazy_ext_ok"]
    args = argparse.Namespace(config_file=config, opts=["train.imports=['no_such_lazy_ext']"])
    with pytest.raises(ConfigError, match=r"^train\.imports no_such_lazy_ext: ModuleNotFoundError: "):
        setup_lazy_config(args, log=False)
