#!/usr/bin/env python
"""Calibration of the analytic cost model against measured layer profiles.

For every profile folder (LLaMA-1 30B, one layer, vLLM fp16 on real GPUs) the roofline predicts
each measured point; prints median and worst relative error per GPU kind, with the calibrated
efficiency factors and with the defaults a kind without a profile gets, and appends the table to
BENCHMARKS.md.

    python scripts/bench_costmodel.py [--profiles ../shared/data/profiles/llama1-30b] [--no-append]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from helix.calibration import calibrate  # noqa: E402
from helix.models import MODEL_CATALOG  # noqa: E402


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path,
                    default=ROOT.parent / "shared" / "data" / "profiles" / "llama1-30b")
    ap.add_argument("--decode-context", type=float, default=1024)
    ap.add_argument("--no-append", action="store_true", help="print only")
    args = ap.parse_args()
    rows = calibrate(MODEL_CATALOG["llama-1-30b"], args.profiles, args.decode_context)
    lines = ["| profile | GPU kind | GPUs | points | median err | worst err | "
             "median err (default factors) | worst err (default factors) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.folder} | {r.gpu} | {r.num_gpus} | {r.points} | "
                     f"{r.median_error:.1%} | {r.worst_error:.1%} | "
                     f"{r.median_error_default:.1%} | {r.worst_error_default:.1%} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_append:
        cmd = "python scripts/bench_costmodel.py"
        with (ROOT / "BENCHMARKS.md").open("a") as fh:
            fh.write(f"\n## Cost model calibration (LLaMA-1 30B layer profiles)\n\n"
                     f"`{cmd}` on {datetime.date.today()} ({machine()}); decode points compared at "
                     f"a context of {args.decode_context:g} tokens.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
