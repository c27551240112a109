"""The import graph of ``largedet`` and ``largedet_video``, read from the sources (every
import statement, those inside functions included): no module imports itself through
others, no package of ``largedet`` imports one that imports it back, and ``largedet.launch``
depends on nothing of ``largedet.engine`` above it."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGES = {
    "largedet": os.path.join(ROOT, "largedet"),
    "largedet_video": os.path.join(ROOT, "projects", "video", "largedet_video"),
}


def _modules(package: str, folder: str) -> dict:
    """module name -> source file, for every .py file of ``package`` (``__init__`` files
    named by their package)."""
    found = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), folder)[: -len(".py")]
            parts = [package, *rel.split(os.sep)]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = os.path.join(dirpath, name)
    return found


def _is_package(module: str, files: dict) -> bool:
    return files[module].endswith("__init__.py")


def _imports(module: str, files: dict) -> set:
    """The modules of ``files`` that ``module``'s import statements name."""
    tree = ast.parse(open(files[module]).read())
    package = module if _is_package(module, files) else module.rsplit(".", 1)[0]
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            named.add(target)
            # `from package import submodule`
            named.update(f"{target}.{alias.name}" for alias in node.names)
    edges = set()
    for name in named:
        # the longest known module the name starts with (`a.b.c` of `a.b.c.func`)
        while name and name not in files:
            name = name.rpartition(".")[0]
        if name and name != module:
            edges.add(name)
    return edges


def _graph() -> dict:
    files = {}
    for package, folder in PACKAGES.items():
        files.update(_modules(package, folder))
    return {module: _imports(module, files) for module in files}


def _cycle(graph: dict):
    """One cycle of ``graph`` as a list of nodes, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def _package_graph(graph: dict) -> dict:
    """The graph between the top-level packages of largedet (``largedet.engine``,
    ``largedet.config``, ...), each module counted in its package."""

    def room(module):
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "largedet" and len(parts) > 1 else None

    rooms = {}
    for module, edges in graph.items():
        source = room(module)
        if source is None:
            continue
        rooms.setdefault(source, set()).update(
            target for target in map(room, edges) if target and target != source
        )
    return rooms


def test_the_graph_is_read():
    graph = _graph()
    # edges this test must see, or it would pass on an empty graph
    assert "largedet.launch.processes" in graph["largedet.engine.trainer"]
    assert "largedet.config.validate" in graph["largedet.engine.defaults"]
    assert "largedet.solver.batch" in graph["largedet_video.multigrid.build"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_through_others():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_package_of_largedet_imports_one_that_imports_it_back():
    cycle = _cycle(_package_graph(_graph()))
    assert cycle is None, " -> ".join(cycle)


def test_launch_is_a_leaf_below_the_engine():
    graph = _graph()
    room = [m for m in graph if m.startswith("largedet.launch")]
    assert "largedet.launch.processes" in room and "largedet.launch.run_summary" in room
    # the engine uses the job's room; the job's room never uses the engine
    for module in room:
        assert not {m for m in graph[module] if m.startswith("largedet.engine")}, module
    # what starting the processes needs of the room: how a run is stopped and lost
    launch = {m for m in graph["largedet.launch.processes"] if m.startswith("largedet.launch")}
    assert launch <= {"largedet.launch.preemption", "largedet.launch.elastic"}, sorted(launch)
    # what an elastic job's processes share with launch: torch only
    assert not {m for m in graph["largedet.launch.elastic"] if m.startswith("largedet")}


def test_config_is_the_bottom_floor():
    """``largedet.config`` imports no other room of largedet: the keys, their rules and the
    checks of the config alone; the checks that need the data, the solver or the checkpoints
    live beside what they check."""
    graph = _graph()
    config = [m for m in graph if m == "largedet.config" or m.startswith("largedet.config.")]
    assert "largedet.config.validate" in config and "largedet.config.lazy" in config
    for module in config:
        others = {m for m in graph[module] if m.startswith("largedet") and not m.startswith("largedet.config")}
        assert not others, (module, sorted(others))


def test_video_config_is_the_bottom_floor():
    """``largedet_video.config`` imports no other room of largedet_video (largedet's config
    it may): the video keys, their rules and defaults; the checks that need the data, the
    model, multigrid or the engine live beside what they check
    (:mod:`largedet_video.engine.checks` joins them)."""
    graph = _graph()
    config = [m for m in graph if m == "largedet_video.config" or m.startswith("largedet_video.config.")]
    assert "largedet_video.config.defaults" in config
    assert "largedet.config" in graph["largedet_video.config.defaults"]
    for module in config:
        others = {
            m for m in graph[module]
            if m.startswith("largedet_video") and not m.startswith("largedet_video.config")
        }  # fmt: skip
        assert not others, (module, sorted(others))
    # the checks before launch see the rooms' checks (the test above would pass without edges)
    assert "largedet_video.data.checks" in graph["largedet_video.engine.checks"]
    assert "largedet_video.config" in graph["largedet_video.engine.checks"]


def test_the_graph_sees_an_import_of_another_room():
    # the check above would pass on a graph without edges
    assert "largedet.solver.plan" in _graph()["largedet.solver.lr_scheduler"]
    assert "largedet.config" in _graph()["largedet.solver.plan"]
