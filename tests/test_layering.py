"""The direction of imports between the packages (README "Layout"), read from the source itself.

Every ``import`` and ``from ... import`` statement is found with ``ast`` (lazy imports inside
functions included, ``TYPE_CHECKING`` blocks too: a reader still sees the edge), and imports built
from strings (``importlib.import_module("worker...")``, ``__import__``) are refused outright, so the
rule cannot be dodged.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("helix", "planner", "coordinator", "worker")

# helix/'s ground floor: the vocabulary every other package may import.
VOCABULARY = ("helix/errors.py", "helix/units.py", "helix/hardware.py", "helix/models.py",
              "helix/costmodel.py", "helix/calibration.py", "helix/profiles.py", "helix/plan.py",
              "helix/spec.py", "helix/spec_errors.py", "helix/yamlio.py", "helix/helix_ini.py",
              "helix/serving.py", "helix/slices.py", "helix/pipelines.py",
              "helix/link_table.py", "helix/tokens.py", "helix/cache.py", "helix/gguf.py",
              "helix/gguf_tokenizer.py")

# (files under this path, modules they must never import)
RULES = [
    ("worker", ("coordinator", "planner", "helix.server", "helix.sim", "helix.commands", "helix.cli")),
    ("coordinator", ("worker", "planner", "helix.server", "helix.sim", "helix.commands", "helix.cli")),
    ("planner", ("coordinator", "worker", "helix.server", "helix.sim", "helix.commands", "helix.cli",
                 "helix.net")),
    ("helix/net", ("coordinator", "worker", "planner", "helix.server", "helix.sim", "helix.commands",
                   "helix.cli")),
    ("helix/sim", ("helix.server", "helix.commands", "helix.cli")),
]


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` statement in ``path`` names (absolute form)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mods: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = path.relative_to(REPO_ROOT).with_suffix("").parts[:-node.level]
                base = ".".join(pkg + ((node.module,) if node.module else ()))
            else:
                base = node.module or ""
            mods.append(base)
            mods += [f"{base}.{a.name}" for a in node.names]   # `from helix import net` imports helix.net
    return mods


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


def _files(prefix: str) -> list[Path]:
    root = REPO_ROOT / prefix
    return sorted(root.rglob("*.py")) if root.is_dir() else [root]


def _hits(mods: list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted({m for m in mods for b in banned if m == b or m.startswith(b + ".")})


@pytest.mark.parametrize("prefix,banned", RULES, ids=[r[0] for r in RULES])
def test_package_never_imports_the_other_side(prefix, banned):
    bad = {str(f.relative_to(REPO_ROOT)): hits for f in _files(prefix)
           if (hits := _hits(imported_modules(f), banned))}
    assert not bad, f"{prefix} must not import {banned}: {bad}"


def test_vocabulary_imports_no_subsystem():
    banned = ("planner", "coordinator", "worker", "helix.server", "helix.sim", "helix.commands",
              "helix.cli", "helix.net", "helix.client")
    bad = {}
    for rel in VOCABULARY:
        path = REPO_ROOT / rel
        assert path.exists(), f"{rel} is listed as vocabulary but does not exist"
        if hits := _hits(imported_modules(path), banned):
            bad[rel] = hits
    assert not bad, f"vocabulary modules import subsystems: {bad}"


def test_every_helix_root_module_is_vocabulary_or_a_front_door():
    """A new module at helix/'s root must be placed on purpose: vocabulary or a front door."""
    # __init__: lazy helix.Client; loadgen: helix bench's client side of an endpoint
    doors = {"helix/__init__.py", "helix/cli.py", "helix/client.py", "helix/loadgen.py"}
    root = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "helix").glob("*.py")}
    assert root - set(VOCABULARY) - doors == set()


def test_no_import_by_string():
    """Only ``helix.cli`` loads its command modules by name (from ``helix.commands``'s own list)."""
    bad = {str(f.relative_to(REPO_ROOT)): calls for p in PACKAGES for f in _files(p)
           if (calls := string_imports(f)) and f != REPO_ROOT / "helix" / "cli.py"}
    assert not bad, f"imports built from strings hide edges from this test: {bad}"


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The rule is only as good as the parser: a lazy import and a relative one are both seen."""
    f = REPO_ROOT / "coordinator" / "_layering_probe.py"
    f.write_text("def f():\n    from worker.engine import SliceEngine\nfrom .runtime import x\n")
    try:
        mods = imported_modules(f)
    finally:
        f.unlink()
    assert "worker.engine" in mods and "coordinator.runtime" in mods
