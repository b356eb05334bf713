"""Quantities written with their units (``10Gbps``, ``50ms``, ``40GB``), parsed, never guessed.

Every parser returns SI base units as a float: bytes/s for bandwidth, seconds for time, bytes for
sizes. A bare number is refused (the unit is what says whether ``100`` meant Mb/s or MB/s), except
where a caller explicitly passes ``default_unit``.

Conventions, written down because they are the usual source of factor-8 and factor-1.07 bugs:
- ``b`` is a bit, ``B`` is a byte: ``10Gbps`` = ``10Gb/s`` = 1.25e9 B/s; ``1GB/s`` = 1e9 B/s.
- Decimal prefixes (k, M, G, T) are powers of 1000; binary ones (Ki, Mi, Gi, Ti) powers of 1024.
  GPU memory sizes are marketed in decimal-ish GB but are binary: ``40GB`` of A100 is really 40 GiB,
  so the hardware catalog writes ``GiB`` explicitly. User YAML gets exactly what it writes.
"""

from __future__ import annotations

import re

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[A-Za-z/]*)\s*$")

_BANDWIDTH_UNITS = {"bps": 1 / 8, "b/s": 1 / 8, "Bps": 1.0, "B/s": 1.0}
_SIZE_UNITS = {"B": 1.0, "b": 1 / 8}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}


class UnitError(ValueError):
    """A quantity could not be parsed; the message says what was expected."""


def _split(text: str | float | int, kind: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {kind} with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    m = _QUANTITY.match(str(text).replace("µ", "u"))
    if not m:
        raise UnitError(f"cannot parse {text!r} as a {kind}")
    return float(m.group("num")), m.group("unit")


def _scale(unit: str, table: dict[str, float], kind: str, text: object, examples: str) -> float:
    # Longest base-unit suffix first, so 'Bps' is not read as prefix 'B' + 'ps'.
    for base in sorted(table, key=len, reverse=True):
        if unit.endswith(base):
            prefix = unit[: -len(base)]
            if prefix in _PREFIX:
                return _PREFIX[prefix] * table[base]
    raise UnitError(f"unknown {kind} unit in {text!r}; use e.g. {examples}")


def parse_bandwidth(text: str | float | int, default_unit: str | None = None) -> float:
    """Bandwidth in bytes/s. ``'10Gbps'`` -> 1.25e9, ``'1GB/s'`` -> 1e9, ``'100Mb/s'`` -> 1.25e7."""
    num, unit = _split(text, "bandwidth")
    unit = unit or (default_unit or "")
    if not unit:
        raise UnitError(f"bandwidth {text!r} has no unit; write e.g. 10Gbps or 1.25GB/s")
    value = num * _scale(unit, _BANDWIDTH_UNITS, "bandwidth", text, "10Gbps, 100Mb/s, 1.25GB/s")
    return value


def parse_duration(text: str | float | int, default_unit: str | None = None) -> float:
    """Time in seconds. ``'50ms'`` -> 0.05, ``'1.5s'`` -> 1.5, ``'200us'`` -> 2e-4."""
    num, unit = _split(text, "duration")
    unit = unit or (default_unit or "")
    if not unit:
        raise UnitError(f"duration {text!r} has no unit; write e.g. 50ms or 1s")
    if unit not in _TIME_UNITS:
        raise UnitError(f"unknown duration unit in {text!r}; use s, ms, us or ns")
    return num * _TIME_UNITS[unit]


def parse_size(text: str | float | int, default_unit: str | None = None) -> float:
    """Size in bytes. ``'40GB'`` -> 4e10, ``'40GiB'`` -> 42949672960, ``'512MiB'`` -> 536870912."""
    num, unit = _split(text, "size")
    unit = unit or (default_unit or "")
    if not unit:
        raise UnitError(f"size {text!r} has no unit; write e.g. 40GB or 16GiB")
    return num * _scale(unit, _SIZE_UNITS, "size", text, "40GB, 16GiB, 512MiB")


def format_bandwidth(bytes_per_s: float) -> str:
    """Human form in bits/s, the way links are sold (``10Gbps``)."""
    bits = bytes_per_s * 8
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{prefix}bps"
    return f"{bits:g}bps"


def format_size(num_bytes: float) -> str:
    """Human form in binary units (``40.0 GiB``)."""
    for prefix, scale in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.1f} {prefix}B"
    return f"{num_bytes:.0f} B"


def format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"
