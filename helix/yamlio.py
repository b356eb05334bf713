"""Reading a YAML file a user pointed at, with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from helix.errors import SpecError


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parsed YAML of ``path``. Missing files, folders and syntax errors raise SpecError with one
    line naming the file (and the line and column of a syntax error)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{p}: is a directory, expected a {what} YAML file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{p}: invalid YAML{where}: {problem}") from None
