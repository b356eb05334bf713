"""Every package a test imports is installed: the README's test command installs ``[dev]`` first,
so a test that skips (``importorskip``) or fails for want of a package means ``[dev]`` misses it.

The scan reads every test module's imports (top-level and inside functions) and every
``pytest.importorskip("name")``; the standard library, the project's own packages and its scripts
are left out.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS.parent / "scripts"
#: The project's packages, and the benchmark scripts some tests import from ``scripts/``.
OWN = {"helix", "planner", "coordinator", "worker", "tests", "scripts",
       *(p.stem for p in SCRIPTS.glob("*.py"))}


def imported_modules(source: str) -> set[str]:
    """Top-level names of the modules ``source`` imports or asks ``importorskip`` for."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def third_party_imports() -> dict[str, list[str]]:
    """Module -> the test files that import it, for modules outside the stdlib and this repo."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        for name in imported_modules(path.read_text()):
            if name not in sys.stdlib_module_names and name not in OWN:
                found.setdefault(name, []).append(str(path.relative_to(TESTS.parent)))
    return found


def test_the_scan_sees_imports_and_importorskip():
    src = "import numpy as np\nfrom yaml import safe_load\nimport os\nx = pytest.importorskip('peft.tuners')\n"
    assert imported_modules(src) == {"numpy", "yaml", "os", "peft"}


def test_every_package_the_tests_import_is_installed():
    imports = third_party_imports()
    assert {"torch", "transformers", "cryptography", "peft", "triton"} <= set(imports)
    missing = {name: files for name, files in imports.items() if importlib.util.find_spec(name) is None}
    assert not missing, ("not installed (add to [dev] in pyproject.toml): "
                         + "; ".join(f"{m} (imported by {', '.join(f[:3])})" for m, f in missing.items()))
