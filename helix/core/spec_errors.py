"""Turning pydantic's validation errors into one line a person can act on.

Node groups (``count: 12``) are expanded before validation, so pydantic's locations index the
expanded list; :func:`point_at_entries` maps them back to the entry the user wrote.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from helix.core.errors import SpecError


def expand_node_groups(value: Any) -> tuple[Any, list[tuple[int, str | None]]]:
    """``{name: "t4-{i}", count: 12, ...}`` becomes 12 nodes t4-0 .. t4-11.

    Returns the expanded node list, and for each expanded node its entry index in the YAML (and its name
    when it came from a ``count`` group), so errors point at what the user wrote."""
    if not isinstance(value, (list, tuple)):
        return value, []
    out: list[Any] = []
    origin: list[tuple[int, str | None]] = []
    for index, entry in enumerate(value):
        if isinstance(entry, dict) and "count" in entry:
            entry = dict(entry)
            count = entry.pop("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise ValueError(f"count must be a positive integer, got {count!r}")
            name = str(entry.get("name", ""))
            if "{i}" not in name:
                raise ValueError(f"a node group with count needs '{{i}}' in its name, got {name!r}")
            for i in range(count):
                out.append({**entry, "name": name.replace("{i}", str(i))})
                origin.append((index, name.replace("{i}", str(i))))
        else:
            out.append(entry)
            origin.append((index, None))
    return out, origin


def point_at_entries(message: str, origin: list[tuple[int, str | None]]) -> str:
    """Rewrite ``nodes[7]`` (expanded index) as ``nodes[2] (t4-5)`` (the YAML entry)."""
    def repl(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if i >= len(origin):
            return m.group(0)
        index, name = origin[i]
        return f"nodes[{index}] ({name})" if name else f"nodes[{index}]"
    return re.sub(r"nodes\[(\d+)\]", repl, message)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after[_check_references()]",):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def first_error(exc: ValidationError, source: str) -> SpecError:
    err = exc.errors()[0]
    loc = _format_loc(tuple(p for p in err["loc"] if not str(p).startswith("function-")))
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("value_error",) and not isinstance(
            err["input"], (dict, list)):
        msg = f"{msg} (got {err['input']!r})"
    where = f"{source}: {loc}" if loc else source
    return SpecError(f"{where}: {msg}")
