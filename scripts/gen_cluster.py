"""Synthetic clusters: N nodes in R regions, a GPU mix from the hardware catalog, links like the
example clusters (fast inside a region, slow and far between regions).

    python scripts/gen_cluster.py --nodes 1000 --regions 5 --seed 0 [-o cluster.yaml]

The result is a cluster spec YAML that ``helix validate`` / ``helix plan`` read. Deterministic: the
same arguments (seed included) give the same bytes. What is random (per seed):

- how many nodes each region gets (every region at least one; sizes vary by up to ~2x);
- each region's GPU mix: the base mix below, each kind's weight scaled by a random factor in
  [0.25, 1.75] per region, so some regions are A100-rich and others T4-heavy, as in geo24;
- each pair of regions' link: bandwidth and latency drawn from ``--inter-bandwidth-mbps`` and
  ``--inter-latency-ms`` (the paper's geo cluster: 100 Mb/s, 50 ms), written as ``region_links``.

Inside a region every pair of nodes gets ``--intra-bandwidth`` at 1 ms, as the paper's clusters.
Nodes are written as ``count`` groups (``r2-t4x2-{i}``), one per region and kind.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: (catalog GPU, GPUs per node, base weight): roughly the paper's 42-node mix (many L4 and T4, a
#: few A100 and V100, multi-GPU L4/T4 boxes) widened with the catalog's other datacenter and
#: consumer cards. CPU is left out: it cannot hold a layer of the models this is for.
BASE_MIX: tuple[tuple[str, int, float], ...] = (
    ("A100-40G", 1, 8), ("A100-80G", 1, 4), ("H100-80G", 1, 2),
    ("V100-16G", 1, 6), ("V100-32G", 1, 3),
    ("L4", 1, 16), ("L4", 2, 6), ("A10G", 1, 6),
    ("T4", 1, 20), ("T4", 2, 8), ("T4", 4, 5),
    ("RTX3090", 1, 3), ("RTX4090", 1, 3),
)
#: Region names as cloud regions are named; past these, ``region-<n>``.
REGION_NAMES = ("us-east", "us-west", "eu-west", "eu-central", "ap-south", "ap-northeast",
                "sa-east", "af-south")


def region_names(count: int) -> list[str]:
    return [REGION_NAMES[i] if i < len(REGION_NAMES) else f"region-{i}" for i in range(count)]


def split_nodes(rng: random.Random, nodes: int, regions: int) -> list[int]:
    """``nodes`` over ``regions``, each >= 1, sizes weighted by a random factor in [0.6, 1.4]."""
    if regions > nodes:
        raise ValueError(f"--regions {regions} > --nodes {nodes}: every region needs a node")
    weights = [rng.uniform(0.6, 1.4) for _ in range(regions)]
    sizes = [1] * regions
    rest = nodes - regions
    raw = [rest * w / sum(weights) for w in weights]
    sizes = [s + int(x) for s, x in zip(sizes, raw)]
    # Hand out what flooring left, largest remainders first (ties by index: deterministic).
    for i in sorted(range(regions), key=lambda i: (-(raw[i] - int(raw[i])), i))[:nodes - sum(sizes)]:
        sizes[i] += 1
    return sizes


def region_mix(rng: random.Random, size: int) -> list[tuple[str, int, int]]:
    """(gpu, gpus per node, count) for one region of ``size`` nodes, kinds with count 0 dropped."""
    weights = [w * rng.uniform(0.25, 1.75) for _, _, w in BASE_MIX]
    counts = [0] * len(BASE_MIX)
    for i in rng.choices(range(len(BASE_MIX)), weights=weights, k=size):
        counts[i] += 1
    return [(gpu, gpus, c) for (gpu, gpus, _), c in zip(BASE_MIX, counts) if c]


def _parse_range(text: str, what: str) -> tuple[float, float]:
    try:
        lo, _, hi = text.partition("-")
        lo_f, hi_f = float(lo), float(hi or lo)
    except ValueError:
        raise SystemExit(f"{what} must be LOW-HIGH (e.g. 100-400), got {text!r}") from None
    if not 0 < lo_f <= hi_f:
        raise SystemExit(f"{what} must satisfy 0 < LOW <= HIGH, got {text!r}")
    return lo_f, hi_f


def generate(nodes: int, regions: int, seed: int = 0, model: str = "llama-2-70b",
             intra_bandwidth: str = "10Gbps", inter_bandwidth_mbps: tuple[float, float] = (100, 400),
             inter_latency_ms: tuple[float, float] = (30, 120)) -> dict[str, Any]:
    """The cluster spec as plain data (what the YAML holds); see the module docstring."""
    if nodes < 1 or regions < 1:
        raise ValueError(f"--nodes and --regions must be >= 1, got {nodes} and {regions}")
    rng = random.Random(seed)
    names = region_names(regions)
    sizes = split_nodes(rng, nodes, regions)
    groups = []
    for r, (region, size) in enumerate(zip(names, sizes)):
        for gpu, gpus, count in region_mix(rng, size):
            label = gpu.lower() + (f"x{gpus}" if gpus > 1 else "")
            group: dict[str, Any] = {"name": f"r{r}-{label}-{{i}}", "gpu": gpu}
            if gpus > 1:
                group["gpus"] = gpus
            groups.append({**group, "count": count, "region": region})
    region_links = []
    for i in range(regions):
        for j in range(i + 1, regions):
            mbps = rng.uniform(*inter_bandwidth_mbps)
            ms = rng.uniform(*inter_latency_ms)
            region_links.append({"regions": [names[i], names[j]],
                                 "bandwidth": f"{mbps:.0f}Mbps", "latency": f"{ms:.0f}ms"})
    spec: dict[str, Any] = {
        "model": model,
        "dtype": "float16",
        "workload": {"mean_prompt_tokens": 763, "mean_output_tokens": 232,
                     "resident_prompt_tokens": 924},
        "regions": {name: {"bandwidth": intra_bandwidth, "latency": "1ms"} for name in names},
        "coordinator": {"region": names[0]},
        "nodes": groups,
    }
    if regions > 1:
        lo_mbps, lo_ms = inter_bandwidth_mbps[0], inter_latency_ms[1]
        # Unused while every pair has its own entry; kept so a hand edit that adds a region
        # gets the slowest figures rather than no connection.
        spec["inter_region"] = {"bandwidth": f"{lo_mbps:.0f}Mbps", "latency": f"{lo_ms:.0f}ms"}
        spec["region_links"] = region_links
    return spec


def to_yaml(spec: dict[str, Any], command: str) -> str:
    """The spec as YAML with a header saying how it was made; node groups one per line."""
    nodes = spec["nodes"]
    body = yaml.safe_dump({k: v for k, v in spec.items() if k != "nodes"}, sort_keys=False,
                          default_flow_style=None, width=110)
    lines = [f"# Synthetic cluster made by `{command}` (scripts/gen_cluster.py).",
             f"# {sum(g['count'] for g in nodes)} nodes in {len(spec['regions'])} region(s).",
             body.rstrip("\n"), "nodes:"]
    lines += ["  - " + yaml.safe_dump(g, default_flow_style=True, sort_keys=False, width=200).strip()
              for g in nodes]
    return "\n".join(lines) + "\n"


def _command(argv: list[str]) -> str:
    """The command line without its output file (the header must not depend on where it went)."""
    kept, skip = [], False
    for a in argv:
        if skip or a.startswith(("-o=", "--output=")):
            skip = False
            continue
        if a in ("-o", "--output"):
            skip = True
            continue
        kept.append(a)
    return " ".join(["python scripts/gen_cluster.py", *kept])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--nodes", type=int, required=True, help="number of nodes (machines)")
    ap.add_argument("--regions", type=int, default=1, help="number of regions (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--model", default="llama-2-70b", help="model the spec names (default llama-2-70b)")
    ap.add_argument("--intra-bandwidth", default="10Gbps",
                    help="bandwidth between two nodes of one region (default 10Gbps)")
    ap.add_argument("--inter-bandwidth-mbps", default="100-400",
                    help="LOW-HIGH range of inter-region bandwidth in Mb/s (default 100-400)")
    ap.add_argument("--inter-latency-ms", default="30-120",
                    help="LOW-HIGH range of inter-region latency in ms (default 30-120)")
    ap.add_argument("-o", "--output", type=Path, help="write here (default: stdout)")
    args = ap.parse_args(argv)
    try:
        spec = generate(args.nodes, args.regions, args.seed, args.model, args.intra_bandwidth,
                        _parse_range(args.inter_bandwidth_mbps, "--inter-bandwidth-mbps"),
                        _parse_range(args.inter_latency_ms, "--inter-latency-ms"))
    except ValueError as exc:
        raise SystemExit(f"gen_cluster: {exc}") from None
    text = to_yaml(spec, _command(argv if argv is not None else sys.argv[1:]))
    # Refuse to write what helix would not read (a bad --model or --intra-bandwidth).
    from helix.core.errors import HelixUserError
    from helix.core.spec import parse_cluster
    try:
        parse_cluster(yaml.safe_load(text), source="generated cluster")
    except HelixUserError as exc:
        raise SystemExit(f"gen_cluster: {exc}") from None
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
