"""The floors of the source tree (README "Layout"), read from the source itself.

Every source file sits on one floor, by its folder:

    4  helix/commands/, helix/cli.py, helix/client.py, helix/loadgen.py   the front doors
    3  helix/sim/, helix/server/                                          simulator, serving stack
    2  planner/, coordinator/, worker/                                    the subsystems
    1  helix/net/                                                         the protocol
    0  helix/core/                                                        the vocabulary

Imports only go down a floor or stay on it, rooms on one floor below the front doors never import
each other, and the file-level import graph has no cycle. Every ``import`` and ``from ... import``
statement is found with ``ast`` (lazy imports inside functions included, ``TYPE_CHECKING`` blocks
too: a reader still sees the edge), and calls that import by a name (``import_module``,
``__import__``) are refused outright. What a parser cannot see (``exec``, a loader reached through
``getattr``) it cannot check: review catches those.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("helix", "planner", "coordinator", "worker")

#: Path prefix (relative to the repository) -> (floor, room). The longest prefix wins.
FLOORS = {
    "helix/core": (0, "vocabulary"),
    "helix/net": (1, "protocol"),
    "planner": (2, "planner"),
    "coordinator": (2, "coordinator"),
    "worker": (2, "worker"),
    "helix/sim": (3, "simulator"),
    "helix/server": (3, "server"),
    "helix/commands": (4, "front doors"),
    "helix/cli.py": (4, "front doors"),
    "helix/client.py": (4, "front doors"),
    "helix/loadgen.py": (4, "front doors"),
    "helix/__init__.py": (4, "front doors"),   # only a lazy ``helix.Client``
}
FRONT_DOORS = 4

#: Rooms that never meet although one floor allows it: the planner has no use for the protocol.
NEVER = {("planner", "protocol")}


def source_files(root: Path = REPO_ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts)


def floor_of(rel: str) -> tuple[int, str] | None:
    hits = [p for p in FLOORS if rel == p or rel.startswith(p + "/")]
    return FLOORS[max(hits, key=len)] if hits else None


def imported_modules(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Every module an ``import`` statement in ``path`` names (absolute form)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mods: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = path.relative_to(root).with_suffix("").parts[:-node.level]
                base = ".".join(pkg + ((node.module,) if node.module else ()))
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names]   # `from helix import net`: helix.net
            mods += names
            if not all(_is_module(n, root) for n in names):
                mods.append(base)   # a name defined in the package's __init__, not a submodule
    return mods


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def module_file(name: str, root: Path = REPO_ROOT) -> str | None:
    """The source file (relative path) that importing ``name`` runs; None outside the packages.
    ``a.b.c`` is ``a/b/c.py`` or ``a/b/c/__init__.py``, else ``c`` is a name inside ``a.b``."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    while parts:
        base = root.joinpath(*parts)
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return str(cand.relative_to(root))
        parts = parts[:-1]
    return None


def import_graph(root: Path = REPO_ROOT) -> nx.DiGraph:
    """File -> file for every import between source files."""
    g = nx.DiGraph()
    for f in source_files(root):
        src = str(f.relative_to(root))
        g.add_node(src)
        for mod in imported_modules(f, root):
            dst = module_file(mod, root)
            if dst is not None and dst != src:
                g.add_edge(src, dst)
    return g


def cycles(g: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def string_imports(path: Path) -> list[str]:
    """Calls that import a module named by a string (``import_module``, ``__import__``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                found.append(ast.unparse(node))
    return found


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def test_every_source_file_is_on_a_floor():
    """A new folder or a module at helix/'s root must be placed on purpose."""
    lost = [str(f.relative_to(REPO_ROOT)) for f in source_files()
            if floor_of(str(f.relative_to(REPO_ROOT))) is None]
    assert not lost, f"not on any floor (add them to FLOORS and README's Layout): {lost}"


def test_imports_only_go_down(graph):
    up, across = [], []
    for src, dst in graph.edges:
        if floor_of(src) is None or floor_of(dst) is None:
            continue   # test_every_source_file_is_on_a_floor names them
        (fs, rs), (fd, rd) = floor_of(src), floor_of(dst)
        if fd > fs:
            up.append(f"{src} (floor {fs}) -> {dst} (floor {fd})")
        elif (fd == fs < FRONT_DOORS and rs != rd) or (rs, rd) in NEVER:
            across.append(f"{src} ({rs}) -> {dst} ({rd})")
    assert not up, "imports that climb a floor:\n" + "\n".join(sorted(up))
    assert not across, "imports between rooms that never meet:\n" + "\n".join(sorted(across))


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found, f"import cycles between source files: {found}"


def test_helix_root_imports_nothing_when_loaded():
    """Python runs ``helix/__init__.py`` for any import below it, whatever floor that is on (it
    sits with the front doors): a module-level import there would load its target for every floor."""
    tree = ast.parse((REPO_ROOT / "helix" / "__init__.py").read_text())
    stmts = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
             and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert not stmts, f"helix/__init__.py runs before every floor; import lazily: {stmts}"


def test_the_source_never_imports_tests_or_scripts():
    bad = {str(f.relative_to(REPO_ROOT)): hits for f in source_files()
           if (hits := sorted({m for m in imported_modules(f)
                               if m.split(".")[0] in ("tests", "scripts")}))}
    assert not bad, f"the source imports test or script code: {bad}"


def test_the_packages_checked_are_the_packages_installed():
    """A new top-level package is installed by pyproject's ``packages.find`` and must be scanned."""
    import tomllib
    include = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert sorted(p.rstrip("*") for p in include) == sorted(PACKAGES)


def test_no_import_by_string():
    """Only ``helix.cli`` loads its command modules by name (from ``helix.commands``'s own list)."""
    bad = {str(f.relative_to(REPO_ROOT)): calls for f in source_files()
           if (calls := string_imports(f)) and f != REPO_ROOT / "helix" / "cli.py"}
    assert not bad, f"imports built from strings hide edges from this test: {bad}"


def test_the_checker_sees_lazy_relative_and_circular_imports(tmp_path):
    """The rules are only as good as the parser: a lazy import, a relative one and a circle through
    them are all seen (in a throwaway tree, nothing written into the source)."""
    for pkg in ("coordinator", "worker"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "coordinator" / "runtime.py").write_text("from .probe import x\n")
    (tmp_path / "coordinator" / "probe.py").write_text(
        "def f():\n    from worker.engine import SliceEngine\n    from coordinator import runtime\n")
    (tmp_path / "worker" / "engine.py").write_text("import coordinator.probe\n")
    probe = tmp_path / "coordinator" / "probe.py"
    assert {"worker.engine", "coordinator.runtime"} <= set(imported_modules(probe, tmp_path))
    assert set(imported_modules(tmp_path / "coordinator" / "runtime.py", tmp_path)) == {
        "coordinator.probe", "coordinator.probe.x"}
    g = import_graph(tmp_path)
    assert ("worker/engine.py", "coordinator/probe.py") in g.edges
    assert cycles(g) == [["coordinator/probe.py", "coordinator/runtime.py", "worker/engine.py"]]
    # one floor, two rooms: test_imports_only_go_down refuses the edge
    assert floor_of("worker/engine.py") == (2, "worker")
    assert floor_of("coordinator/probe.py") == (2, "coordinator")
