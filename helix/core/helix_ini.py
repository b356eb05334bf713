"""Reader for the reference Helix planner's INI cluster format.

A cluster file has ``[ComputeNode-i]`` sections (``type=L4``, ``connected_nodes=['source', 1, 'sink']``)
and ``[Link-a-b]`` sections (``bandwidth=1.25 * gbps``, ``latency=1 * MilliSec``) where a and b are
node indices, ``source`` or ``sink``; a ``machine_profile.ini`` gives per type ``vram_size`` and NIC
speeds. Both become one :class:`helix.core.spec.ClusterSpec`: source and sink are the coordinator, node i
is named ``node-i``, a type like ``T4x2`` is two T4s in one machine.

Units, as the reference code defines its constants (they are *bytes*, not bits): ``kbps``/``mbps``
/``gbps`` = 1e3/1e6/1e9 bytes/s, so ``1.25 * gbps`` is 1.25e9 B/s; ``KB``/``MB``/``GB`` = 1024-based
bytes; ``MicroSec``/``MilliSec``/``Sec`` seconds. ``-1`` means unlimited.

Links, as the reference reads them: ``[Link-a-b]`` between two nodes serves both directions unless a
``[Link-b-a]`` section gives the other one; ``[Link-source-i]`` is coordinator -> node i only and
``[Link-i-sink]`` node i -> coordinator only (they differ in the geo-distributed cases). The spec is
written compactly (:mod:`helix.core.link_table`): regions inferred from the link table (or given), their
figures, and per-pair overrides only where a link differs from them.

Layouts: a reference ``*_sol.ini`` (``[Solution] compute_node_<i + offset>=[layers]``, ``offset`` in
``[Settings]``) names the i-th ``[ComputeNode-i]``; :func:`read_layout` returns node index ->
half-open layer range.
"""

from __future__ import annotations

import ast
import configparser
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helix.core.errors import SpecError
from helix.core.hardware import lookup_gpu
from helix.core.link_table import Figure, Regions, compact, infer_regions, regions_from_mapping
from helix.core.plan import COORDINATOR
from helix.core.spec import ClusterSpec, parse_cluster
from helix.core.yamlio import read_yaml

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
    # 12 significant digits: 51 * MilliSec is 0.051, not 0.051000000000000004.
    return float(f"{value * _UNITS.get(unit or '', 1.0):.12g}")


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
        return COORDINATOR
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
           ) -> dict[tuple[str, str], Figure]:
    """Directed link table: (from, to) -> (bandwidth bytes/s, latency s), as the reference reads it."""
    given: dict[tuple[str, str], Figure] = {}
    for section in cluster.sections():
        m = re.fullmatch(r"Link-(\w+)-(\w+)", section)
        if not m:
            continue
        where = f"{path} [{section}]"
        if m.group(1) == "sink" or m.group(2) == "source":
            raise SpecError(f"{where}: 'source' can only start a link and 'sink' only end one")
        a, b = _vertex(m.group(1), where), _vertex(m.group(2), where)
        if a == b:
            raise SpecError(f"{where}: a link joins two different vertices")
        for v in (a, b):
            if v != COORDINATOR and v not in nodes:
                raise SpecError(f"{where}: no [ComputeNode-{v.split('-')[1]}] section for this link")
        bw = parse_quantity(cluster[section].get("bandwidth", ""), f"{where} bandwidth")
        lat = parse_quantity(cluster[section].get("latency", "0"), f"{where} latency") or 0.0
        if bw is None or bw <= 0:
            raise SpecError(f"{where}: bandwidth must be positive")
        given[(a, b)] = (bw, lat)
    table = dict(given)
    for (a, b), fig in given.items():  # a node-to-node section serves both directions
        if COORDINATOR not in (a, b):
            table.setdefault((b, a), fig)
    return table


@dataclass(frozen=True)
class Conversion:
    """A converted cluster and what the conversion decided (for ``helix convert`` to print)."""

    spec: ClusterSpec
    regions: Regions
    tables_for: tuple[str, ...] = ()
    """Node labels that got a throughput table."""


def convert_ini(cluster_path: str | Path, profile_path: str | Path, model: str = "llama-2-70b",
                *, regions: Any = None, regions_source: str = "--regions",
                tolerance: float = 0.0,
                throughput_tables: dict[str, tuple[float, ...]] | None = None) -> Conversion:
    """A reference cluster ``.ini`` and its ``machine_profile.ini`` as a compact ClusterSpec.

    ``regions`` (region -> node names) replaces the inferred regions; ``tolerance`` (relative)
    lets links within it of their region's figure take that figure instead of an override;
    ``throughput_tables`` (label -> T(1..n)) go into ``performance.throughput_tables`` for the
    labels the cluster has."""
    if not tolerance >= 0:
        raise SpecError(f"--link-tolerance must be >= 0, got {tolerance}")
    cpath, ppath = Path(cluster_path), Path(profile_path)
    cluster, profile = _read(cpath), _read(ppath)
    nodes = _nodes(cluster, profile, cpath)
    names = [n["name"] for n in nodes]
    table = _links(cluster, cpath, set(names))
    if not table:
        raise SpecError(f"{cpath}: no [Link-a-b] sections")
    try:
        found = infer_regions(table, names) if regions is None else \
            regions_from_mapping(regions, names, regions_source)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    region_of = {n: r for r, ms in found.members.items() for n in ms}
    for node in nodes:
        node["region"] = region_of[node["name"]]
    data: dict[str, Any] = {"model": model, **compact(table, names, found, tolerance),
                            "nodes": nodes}
    nic = _coordinator_nic(profile)
    if nic is not None:
        data["coordinator"]["nic_bandwidth"] = f"{nic!r}B/s"
    labels = {_label(n) for n in nodes}
    chosen = {k: v for k, v in (throughput_tables or {}).items() if k in labels}
    if throughput_tables is not None and not chosen:
        raise SpecError(f"the throughput tables name none of this cluster's node kinds "
                        f"({', '.join(sorted(labels))}); they have {', '.join(throughput_tables)}")
    if chosen:
        data["performance"] = {"throughput_tables": {k: list(v) for k, v in chosen.items()}}
    spec = parse_cluster(data, source=str(cpath))
    return Conversion(spec, found, tuple(sorted(chosen)))


def _label(node: dict[str, Any]) -> str:
    gpu = lookup_gpu(node["gpu"])
    name = gpu.name if gpu is not None else node["gpu"]
    return name if node["gpus"] == 1 else f"{name}x{node['gpus']}"


def _coordinator_nic(profile: configparser.ConfigParser) -> float | None:
    """The coordinator sends from [SourceNode] and receives at [SinkNode]: the slower NIC."""
    speeds = [parse_quantity(profile[section].get(key, "-1"), f"machine profile [{section}] {key}")
              for section, key in (("SourceNode", "outbound_nic_speed"),
                                   ("SinkNode", "inbound_nic_speed"))
              if profile.has_section(section)]
    known = [s for s in speeds if s is not None]
    return min(known) if known else None


class _Flow(dict):
    """A mapping YAML writes on one line (one node, one link per line)."""


class _FlowList(list):
    """A list YAML writes on one line (a throughput table)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True))
_Dumper.add_representer(
    _FlowList, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


def spec_yaml(spec: ClusterSpec) -> str:
    """The spec as YAML with one line per node, link, region and table (hundreds of them)."""
    data = spec.to_dict()
    first = ("name", "between", "from", "to", "regions")
    for key in ("nodes", "links", "region_links"):
        if key in data:  # the entry's ends (or name) first, then its figures
            data[key] = [_Flow(sorted(x.items(), key=lambda kv: kv[0] not in first))
                         for x in data[key]]
    data["regions"] = {r: _Flow(v) for r, v in data["regions"].items()}
    if "inter_region" in data:
        data["inter_region"] = _Flow(data["inter_region"])
    for key in ("outbound", "inbound"):
        if key in data["coordinator"]:
            data["coordinator"][key] = _Flow(data["coordinator"][key])
    tables = data.get("performance", {}).get("throughput_tables")
    if tables:
        data["performance"]["throughput_tables"] = {k: _FlowList(v) for k, v in tables.items()}
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120)


def read_helix_ini(cluster_path: str | Path, profile_path: str | Path,
                   model: str = "llama-2-70b") -> ClusterSpec:
    """Turn a reference cluster ``.ini`` and its ``machine_profile.ini`` into a ClusterSpec."""
    return convert_ini(cluster_path, profile_path, model).spec


def load_throughput_tables(path: str | Path, case: str | None = None
                           ) -> dict[str, tuple[float, ...]]:
    """T(k) tables from YAML: ``label: [T(1), T(2), ...]``, or one such mapping per case
    (``3cluster24: {A100-40G: [...], ...}``, as ``reference_cases/throughput_tables.yaml``), then
    ``case`` picks one. Labels may use the reference's names (``A100``, ``T4x2``)."""
    p = Path(path)
    data = read_yaml(p, "throughput tables")
    if not isinstance(data, dict) or not data:
        raise SpecError(f"{p}: expected a mapping of node label -> list of tokens/s")
    if all(isinstance(v, dict) for v in data.values()):
        if case not in data:
            raise SpecError(f"{p}: holds tables for cases {', '.join(map(str, data))}; "
                            f"{'no case ' + repr(case) if case else 'name one with --tables-case'}")
        data = data[case]
    tables: dict[str, tuple[float, ...]] = {}
    for label, values in data.items():
        gpu, count = _split_type(str(label))
        kind = lookup_gpu(gpu)
        if kind is None:
            raise SpecError(f"{p}: {label!r}: unknown GPU {gpu!r}")
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, (int, float)) and v > 0 for v in values):
            raise SpecError(f"{p}: {label!r}: expected a non-empty list of positive tokens/s")
        tables[kind.name if count == 1 else f"{kind.name}x{count}"] = tuple(map(float, values))
    return tables


def read_layout(path: str | Path) -> dict[int, tuple[int, int]]:
    """A reference layout file: node index -> half-open layer range [start, end)."""
    p = Path(path)
    parser = _read(p)
    if not parser.has_section("Solution"):
        raise SpecError(f"{p}: no [Solution] section (expected the reference's *_sol.ini layout)")
    offset_text = parser.get("Settings", "offset", fallback="0")
    if not offset_text.strip().lstrip("-").isdigit():
        raise SpecError(f"{p}: [Settings] offset: expected an integer, got {offset_text!r}")
    offset = int(offset_text)
    layout: dict[int, tuple[int, int]] = {}
    for key, value in parser["Solution"].items():
        m = re.fullmatch(r"compute_node_(\d+)", key)
        if not m:
            raise SpecError(f"{p}: [Solution] {key}: expected compute_node_<index>")
        try:
            layers = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            layers = None
        if not isinstance(layers, list) or not all(isinstance(x, int) for x in layers):
            raise SpecError(f"{p}: [Solution] {key}: expected a list of layer indices, got {value!r}")
        if not layers:
            continue
        start, end = min(layers), max(layers) + 1
        if sorted(layers) != list(range(start, end)):
            raise SpecError(f"{p}: [Solution] {key}: layers {value} are not one contiguous range")
        layout[int(m.group(1)) - offset] = (start, end)
    return layout
