"""BENCHMARKS.md holds the current figure of every benchmark once; each script rewrites its own.

A benchmark's figures sit between two marker lines, ``<!-- NAME:start -->`` and
``<!-- NAME:end -->``. :func:`write_section` replaces what is between them, so a new run
supersedes the old one (earlier runs live in git's history); a block that is missing is added,
under its heading. Text outside the markers (headings, a reading written by hand) is left as it
is. A script whose run has parts measured apart (``--part``, ``--only``) gives each part a block
of its own, so a run of one part keeps the others' figures.

    from benchdoc import write_section
    write_section("bench_drain", table, heading="## Draining a node", command=cmd, load0=load0)

The scripts import it with ``scripts/`` on the path, as Python puts a script's own folder there.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"


def markers(name: str) -> tuple[str, str]:
    """The start and end lines of block ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """This machine in a few words: cores, CPU model, Python version (not its host name)."""
    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"


def stamp(command: str, load0: float) -> str:
    """Where a block's figures come from: the command, the time, the machine and its load
    average when the run started (``load0``) and now."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"`{command}` on {now} ({machine()}; load average {load0:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end).")


def read_section(name: str, path: Path | None = None) -> str | None:
    """What block ``name`` of ``path`` (BENCHMARKS.md) holds now, or None when it has none."""
    path = BENCHMARKS if path is None else path
    text = path.read_text() if path.exists() else ""
    start, end = markers(name)
    if start not in text or end not in text:
        return None
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def write_section(name: str, body: str, *, heading: str | None = None, command: str | None = None,
                  load0: float | None = None, path: Path | None = None) -> None:
    """Make ``body`` the whole of block ``name`` in ``path`` (BENCHMARKS.md).

    With ``command`` (and ``load0``, the load average when the run started) the block opens with
    :func:`stamp`'s sentence. A block that is not there yet goes at the end of ``heading``'s section
    (up to the next ``## `` heading), or at the end of the file under ``heading`` when the file
    lacks it too, or simply at the end without one.
    """
    if command is not None:   # the stamp opens the body's first paragraph, or stands before a table
        first = stamp(command, os.getloadavg()[0] if load0 is None else load0)
        body = body.lstrip("\n")
        body = first + ("\n\n" if body.startswith(("|", "#", "-", "<", "`")) else " ") + body
    path = BENCHMARKS if path is None else path
    start, end = markers(name)
    body = body.strip("\n")
    block = f"{start}\n{body}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    elif heading is not None and f"\n{heading}\n" in f"\n{text}":
        at = f"\n{text}".index(f"\n{heading}\n") + len(heading)
        nxt = text.find("\n## ", at)
        cut = len(text) if nxt < 0 else nxt
        text = text[:cut].rstrip("\n") + f"\n\n{block}\n" + text[cut:]
    else:
        title = f"{heading}\n\n" if heading is not None else ""
        text = text.rstrip("\n") + f"\n\n{title}{block}\n"
    path.write_text(text)
