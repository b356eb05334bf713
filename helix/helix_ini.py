"""Reader for the reference Helix planner's INI cluster format.

A cluster file has ``[ComputeNode-i]`` sections (``type=L4``, ``connected_nodes=['source', 1, 'sink']``)
and ``[Link-a-b]`` sections (``bandwidth=1.25 * gbps``, ``latency=1 * MilliSec``) where a and b are
node indices, ``source`` or ``sink``; a ``machine_profile.ini`` gives per type ``vram_size`` and NIC
speeds. Both become one :class:`helix.spec.ClusterSpec`: source and sink are the coordinator, node i
is named ``node-i``, a type like ``T4x2`` is two T4s in one machine.

Units, as the reference code defines its constants (they are *bytes*, not bits): ``kbps``/``mbps``
/``gbps`` = 1e3/1e6/1e9 bytes/s, so ``1.25 * gbps`` is 1.25e9 B/s; ``KB``/``MB``/``GB`` = 1024-based
bytes; ``MicroSec``/``MilliSec``/``Sec`` seconds. ``-1`` means unlimited. The reference links are
directed; this spec's links are not, so when both directions of a pair are given the smaller
bandwidth and larger latency are kept (the conservative reading).
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from typing import Any

from helix.errors import SpecError
from helix.spec import ClusterSpec, parse_cluster

_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9,
          "B": 1.0, "KB": 2.0**10, "MB": 2.0**20, "GB": 2.0**30, "TB": 2.0**40,
          "Sec": 1.0, "MilliSec": 1e-3, "MicroSec": 1e-6, "NanoSec": 1e-9}
_EXPR = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?:\*\s*([A-Za-z]+))?\s*$")


def parse_quantity(text: str, where: str) -> float | None:
    """``'1.25 * gbps'`` -> 1.25e9; ``'-1'`` -> None (unlimited)."""
    m = _EXPR.match(text)
    if not m:
        raise SpecError(f"{where}: cannot parse {text!r} (expected 'NUMBER * UNIT')")
    value = float(m.group(1))
    if value == -1:
        return None
    unit = m.group(2)
    if unit is not None and unit not in _UNITS:
        raise SpecError(f"{where}: unknown unit {unit!r}; known: {', '.join(_UNITS)}")
    return value * _UNITS.get(unit or "", 1.0)


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    try:
        with path.open() as fh:
            parser.read_file(fh)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except configparser.Error as exc:
        raise SpecError(f"{path}: invalid INI: {str(exc).splitlines()[0]}") from None
    return parser


def _vertex(token: str, where: str) -> str:
    if token in ("source", "sink"):
        return "coordinator"
    if not token.isdigit():
        raise SpecError(f"{where}: bad vertex {token!r} (expected a node index, source or sink)")
    return f"node-{int(token)}"


def _split_type(gpu_type: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.+?)x(\d+)", gpu_type)
    return (m.group(1), int(m.group(2))) if m else (gpu_type, 1)


def _nodes(cluster: configparser.ConfigParser, profile: configparser.ConfigParser,
           path: Path) -> list[dict[str, Any]]:
    nodes = []
    for section in cluster.sections():
        m = re.fullmatch(r"ComputeNode-(\d+)", section)
        if not m:
            continue
        where = f"{path} [{section}]"
        gpu_type = cluster[section].get("type")
        if not gpu_type:
            raise SpecError(f"{where}: missing 'type'")
        gpu, count = _split_type(gpu_type.strip())
        node: dict[str, Any] = {"name": f"node-{int(m.group(1))}", "gpu": gpu, "gpus": count}
        if profile.has_section(gpu_type):
            machine = profile[gpu_type]
            pwhere = f"machine profile [{gpu_type}]"
            vram = parse_quantity(machine.get("vram_size", "-1"), f"{pwhere} vram_size")
            if vram is not None:
                node["memory"] = f"{vram / count!r}B"
            nic = _nic(machine, pwhere)
            if nic is not None:
                node["nic_bandwidth"] = f"{nic!r}B/s"
        nodes.append(node)
    if not nodes:
        raise SpecError(f"{path}: no [ComputeNode-i] sections")
    return nodes


def _nic(section: configparser.SectionProxy, where: str) -> float | None:
    speeds = [parse_quantity(section.get(k, "-1"), f"{where} {k}")
              for k in ("inbound_nic_speed", "outbound_nic_speed")]
    known = [s for s in speeds if s is not None]
    return min(known) if known else None


def _links(cluster: configparser.ConfigParser, path: Path, nodes: set[str]
           ) -> dict[frozenset[str], tuple[float, float]]:
    """Undirected pair -> (bandwidth bytes/s, latency s)."""
    pairs: dict[frozenset[str], tuple[float, float]] = {}
    for section in cluster.sections():
        m = re.fullmatch(r"Link-(\w+)-(\w+)", section)
        if not m:
            continue
        where = f"{path} [{section}]"
        a, b = _vertex(m.group(1), where), _vertex(m.group(2), where)
        for v in (a, b):
            if v != "coordinator" and v not in nodes:
                raise SpecError(f"{where}: no [ComputeNode-{v.split('-')[1]}] section for this link")
        bw = parse_quantity(cluster[section].get("bandwidth", ""), f"{where} bandwidth")
        lat = parse_quantity(cluster[section].get("latency", "0"), f"{where} latency") or 0.0
        if bw is None or bw <= 0:
            raise SpecError(f"{where}: bandwidth must be positive")
        key = frozenset((a, b))
        if key in pairs:  # the other direction: keep the conservative figures
            bw, lat = min(bw, pairs[key][0]), max(lat, pairs[key][1])
        pairs[key] = (bw, lat)
    return pairs


def read_helix_ini(cluster_path: str | Path, profile_path: str | Path,
                   model: str = "llama-2-70b") -> ClusterSpec:
    """Turn a reference cluster ``.ini`` and its ``machine_profile.ini`` into a ClusterSpec."""
    cpath, ppath = Path(cluster_path), Path(profile_path)
    cluster, profile = _read(cpath), _read(ppath)
    nodes = _nodes(cluster, profile, cpath)
    pairs = _links(cluster, cpath, {n["name"] for n in nodes})
    if not pairs:
        raise SpecError(f"{cpath}: no [Link-a-b] sections")
    links = [{"between": sorted(key), "bandwidth": f"{bw!r}B/s", "latency": f"{lat!r}s"}
             for key, (bw, lat) in pairs.items()]
    bandwidths = sorted(bw for bw, _ in pairs.values())
    data: dict[str, Any] = {
        "model": model,
        # Every pair is listed, so the region figures only describe the typical link.
        "regions": {"default": {"bandwidth": f"{bandwidths[len(bandwidths) // 2]!r}B/s"}},
        "only_listed_links": True,
        "links": links,
        "nodes": nodes,
    }
    if profile.has_section("SourceNode"):
        nic = _nic(profile["SourceNode"], "machine profile [SourceNode]")
        if nic is not None:
            data["coordinator"] = {"nic_bandwidth": f"{nic!r}B/s"}
    return parse_cluster(data, source=str(cpath))

