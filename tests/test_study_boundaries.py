"""The study is a project of its own (study/): installed, so nothing reaches it through an
import path edit; what users run (largedet, the video package, tools/, the scripts) and the
speed benchmarks never import it; and no test folder edits the import path either (the
folders' shared helpers are on it through pytest.ini's ``pythonpath``)."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY_PACKAGES = {"largedet_study", "video_study"}
#: what a user runs or imports, and the speed benchmarks
NOT_THE_STUDY = ("largedet", "tools", "benchmarks", os.path.join("projects", "video"))


def _python_files(*folders):
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "output") and not d.endswith(".egg-info")]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def _imported(path):
    """The top-level names of every module ``path`` imports (those inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _edits_import_path(path):
    """Whether ``path`` calls ``sys.path.insert``/``append``/``extend`` or assigns ``sys.path``."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("insert", "append", "extend"):
                target = node.func.value
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
        if isinstance(target, ast.Attribute) and target.attr == "path":
            if isinstance(target.value, ast.Name) and target.value.id == "sys":
                return True
    return False


def _rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def test_nothing_users_run_and_no_speed_benchmark_imports_the_study():
    files = [p for p in _python_files(*NOT_THE_STUDY) if os.sep + "tests" + os.sep not in p]
    assert len(files) > 100  # the walk found the sources
    assert not _rel(p for p in files if _imported(p) & STUDY_PACKAGES)


def test_the_study_and_the_test_folders_edit_no_import_path():
    study = list(_python_files("study"))
    conftests = [p for p in _python_files("tests", "projects", "study") if os.path.basename(p) == "conftest.py"]
    assert os.path.join(ROOT, "study", "largedet_study", "grid.py") in study
    assert len(conftests) >= 4  # tests/, tests/cuda, study/tests, projects/video/tests
    assert not _rel(p for p in study + conftests if _edits_import_path(p))


def test_the_checks_see_what_they_look_for(tmp_path):
    # the two tests above would pass on checks that find nothing
    edit = tmp_path / "edit.py"
    edit.write_text("import sys\nsys.path.insert(0, 'x')\n")
    uses = tmp_path / "uses.py"
    uses.write_text("def f():\n    from largedet_study.grid import build_grid\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import os\nos.path.join('a')\npaths = []\npaths.append(1)\n")
    assert _edits_import_path(str(edit)) and not _edits_import_path(str(plain))
    assert "largedet_study" in _imported(str(uses)) and not _imported(str(plain)) & STUDY_PACKAGES
