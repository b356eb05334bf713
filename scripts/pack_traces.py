"""Pack the Azure LLM inference traces 2023 into the compact form shipped in ``helix/data/traces/``.

The public traces (Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
Splitting", ISCA 2024; CC-BY 4.0) are CSVs of ``TIMESTAMP,ContextTokens,GeneratedTokens``. The
packed form keeps every request (the length filters are applied when a workload is loaded), sorted
by arrival (stable), with each arrival written as the gap to the previous one in units of 100 ns (the
traces' own resolution), gzip-compressed:

    # comment lines (source, licence, citation)
    ARRIVAL_GAP_100NS,ContextTokens,GeneratedTokens
    0,374,44
    43145790,396,109

``helix.sim.workload.load_azure_trace`` reads both forms. Run from the repository root:

    python scripts/pack_traces.py ../shared/data/traces/azure_llm_2023_conv.csv conv
"""

from __future__ import annotations

import csv
import gzip
import sys
from datetime import datetime
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "helix" / "data" / "traces"
SERVICES = {"conv": "conversation", "code": "code"}


def _ticks(timestamp: str) -> int:
    """100 ns ticks since the epoch of a ``YYYY-MM-DD HH:MM:SS.fffffff`` timestamp (exact)."""
    day_time, _, frac = timestamp.strip().partition(".")
    whole = datetime.fromisoformat(day_time)
    seconds = (whole - datetime(1970, 1, 1)).days * 86400 + whole.hour * 3600 + whole.minute * 60 + whole.second
    return seconds * 10**7 + int((frac + "0000000")[:7])


def pack(src: Path, name: str) -> Path:
    with src.open(newline="") as f:
        rows = [(_ticks(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                for r in csv.DictReader(f)]
    rows.sort(key=lambda r: r[0])
    out = OUT_DIR / f"azure_llm_2023_{name}.csv.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# Azure LLM inference trace 2023, {SERVICES[name]} service: {len(rows)} requests.",
             "# Source: the AzurePublicDataset repository on GitHub (AzureLLMInferenceTrace_"
             f"{'conv' if name == 'conv' else 'code'}), licence CC-BY 4.0.",
             '# Cite: Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase '
             'Splitting", ISCA 2024.',
             "# Packed by scripts/pack_traces.py: arrival gaps in 100 ns ticks, rows in arrival order.",
             "ARRIVAL_GAP_100NS,ContextTokens,GeneratedTokens"]
    prev = rows[0][0]
    for t, p, o in rows:
        lines.append(f"{t - prev},{p},{o}")
        prev = t
    # mtime=0: the same input always packs to the same bytes.
    out.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9, mtime=0))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in SERVICES:
        sys.exit("usage: python scripts/pack_traces.py AZURE.csv conv|code")
    path = pack(Path(sys.argv[1]), sys.argv[2])
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
