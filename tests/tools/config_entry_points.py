"""Find the repository's entry points that read a config, and give each a config file
whose yaml tag would run a command; write what each did to ``WORK_DIR/observed.json``.

Run by ``tests/tools/test_no_code_from_config.py`` in a fresh interpreter, from any folder:

    python tests/tools/config_entry_points.py WORK_DIR

The entry points are the scripts ``tools/*.py``, ``projects/video/train.py``,
``projects/video/benchmarks/*.py`` and ``benchmarks/*.py``, and the console commands of
``setup.py``. Each is started as its command line starts it (``runpy`` with ``__name__ ==
"__main__"``, a console command's function called), and stopped at its first
``ArgumentParser.parse_args``: the parser says whether it takes ``--config`` or
``--config-file`` and which options it requires. Those that take a config are then run, in
this process, on ``WORK_DIR/tagged.yaml`` (whose ``OUTPUT_DIR`` is
``!!python/object/apply:os.system ["touch MARKER"]``) and on ``WORK_DIR/child.yaml`` (a clean
file whose ``_BASE_`` is such a file), each with its own marker file, a dummy value for each
other required option, stdout and stderr captured.
"""

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT_GLOBS = ("tools", "projects/video", "projects/video/benchmarks", "benchmarks", "study")
CONFIG_FLAGS = ("--config", "--config-file")


class _Parsed(Exception):
    """Raised in place of parsing: carries the entry point's parser."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def scripts():
    found = []
    for folder in SCRIPT_GLOBS:
        path = os.path.join(ROOT, folder)
        found += sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".py"))
    return [p for p in found if p != os.path.abspath(__file__)]


def console_scripts():
    """``{name: "module:function"}`` of setup.py's ``console_scripts``."""
    text = open(os.path.join(ROOT, "setup.py")).read()
    return dict(re.findall(r'"([\w-]+)\s*=\s*([\w.]+:\w+)"', text))


def start(entry, argv):
    """Run the entry point ``entry`` (a script path or ``module:function``) with ``argv``."""
    sys.argv = [entry, *argv]
    if entry.endswith(".py"):
        sys.path.insert(0, os.path.dirname(entry))  # as `python SCRIPT` has it
        try:
            runpy.run_path(entry, run_name="__main__")
        finally:
            sys.path.remove(os.path.dirname(entry))
    else:
        module, function = entry.split(":")
        __import__(module)
        result = getattr(sys.modules[module], function)()
        if isinstance(result, int) and result:
            sys.exit(result)


def parser_of(entry):
    """The first parser the entry point parses its command line with (None if none; the
    traceback where it fails before parsing)."""
    original = argparse.ArgumentParser.parse_known_args

    def intercept(self, args=None, namespace=None):
        raise _Parsed(self)

    argparse.ArgumentParser.parse_known_args = intercept
    saved = list(sys.argv)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            start(entry, [])
    except _Parsed as parsed:
        return parsed.parser
    except SystemExit:
        return None
    except Exception:
        return traceback.format_exc()
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved
    return None


def required_options(parser):
    """A dummy value for each required option other than the config (``--input x``)."""
    argv = []
    for action in parser._actions:
        if action.required and action.option_strings and not set(action.option_strings) & set(CONFIG_FLAGS):
            argv += [action.option_strings[0], os.path.join(os.getcwd(), "dummy")]
    return argv


def run(entry, argv):
    """What ``entry`` did with ``argv``: its exit status, stdout, stderr, an exception."""
    out, err = io.StringIO(), io.StringIO()
    outcome = {"exit": 0, "raised": ""}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            start(entry, argv)
    except SystemExit as e:
        outcome["exit"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # a traceback where one line belongs: recorded, for the test to show
        outcome["exit"] = 1
        outcome["raised"] = traceback.format_exc()
    outcome.update(stdout=out.getvalue(), stderr=err.getvalue())
    return outcome


def tagged_config(work_dir, name, marker):
    path = os.path.join(work_dir, name)
    with open(path, "w") as f:
        f.write(f'SEED: 3\nOUTPUT_DIR: !!python/object/apply:os.system ["touch {marker}"]\n')
    return path


def main():
    work_dir = os.path.abspath(sys.argv[1])
    os.chdir(work_dir)
    sys.path.insert(0, os.path.join(ROOT, "projects", "video"))
    entries = {os.path.relpath(p, ROOT): p for p in scripts()}
    entries.update({f"console:{name}": target for name, target in console_scripts().items()})
    observed = {"entry_points": sorted(entries), "takes_config": [], "runs": {}, "failed_to_start": {}}
    for label, entry in entries.items():
        parser = parser_of(entry)
        if isinstance(parser, str):
            observed["failed_to_start"][label] = parser
            continue
        flags = {s for a in (parser._actions if parser else []) for s in a.option_strings}
        if not flags & set(CONFIG_FLAGS):
            continue
        observed["takes_config"].append(label)
        flag = next(f for f in CONFIG_FLAGS if f in flags)
        slug = re.sub(r"\W", "_", label)
        for case in ("direct", "base"):
            marker = os.path.join(work_dir, f"ran_{slug}_{case}")
            tagged = tagged_config(work_dir, f"tagged_{slug}_{case}.yaml", marker)
            config = tagged
            if case == "base":
                config = os.path.join(work_dir, f"child_{slug}.yaml")
                with open(config, "w") as f:
                    f.write(f"_BASE_: {os.path.basename(tagged)}\nSEED: 4\n")
            outcome = run(entry, [flag, config, *required_options(parser)])
            outcome.update(config=config, tagged=tagged, marker_created=os.path.exists(marker))
            observed["runs"][f"{label} ({case})"] = outcome
    with open(os.path.join(work_dir, "observed.json"), "w") as f:
        json.dump(observed, f, indent=1)


if __name__ == "__main__":
    main()
