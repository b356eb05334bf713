"""A cluster's directed link table, and its compaction into regions (for ``helix convert``).

A link table maps every connected ordered pair of vertices (node names, or ``coordinator``) to its
(bandwidth bytes/s, latency s). Clusters spread over regions show it plainly: links inside a region
are fast, links between regions one or two orders of magnitude slower. :func:`infer_regions` finds
that gap and takes the connected components over the fast links as the regions;
:func:`compact` then describes the table with per-region figures, an inter-region default, per
region-pair and coordinator figures, and per-pair overrides only where a link differs from the
figure that would otherwise apply (by more than a relative ``tolerance``; 0 keeps every figure
exact, so the spec describes the same network as the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from helix.core.plan import COORDINATOR
from helix.core.units import format_bandwidth, format_duration

#: (bandwidth bytes/s, latency s)
Figure = tuple[float, float]
LinkTable = Mapping[tuple[str, str], Figure]

#: Consecutive distinct bandwidths (or latencies) this far apart split fast links from slow ones.
GAP_RATIO = 4.0


@dataclass(frozen=True)
class Regions:
    """Node names per region (in node order), and how they were found (one line for people)."""

    members: dict[str, tuple[str, ...]]
    how: str


def _gap_threshold(values: Sequence[float]) -> float | None:
    """The geometric middle of the widest ratio gap between sorted distinct positive values, when
    that gap is at least :data:`GAP_RATIO`; None when the values form one cluster."""
    distinct = sorted({v for v in values if v > 0})
    best = None
    for lo, hi in zip(distinct, distinct[1:]):
        if hi / lo >= GAP_RATIO and (best is None or hi / lo > best[1] / best[0]):
            best = (lo, hi)
    return None if best is None else math.sqrt(best[0] * best[1])


def _pairs(table: LinkTable, nodes: Sequence[str]) -> dict[frozenset[str], Figure]:
    """Node pairs with the slower direction's figures (a region is joined both ways)."""
    out: dict[frozenset[str], Figure] = {}
    for (a, b), (bw, lat) in table.items():
        if COORDINATOR in (a, b):
            continue
        key = frozenset((a, b))
        if key in out:
            bw, lat = min(bw, out[key][0]), max(lat, out[key][1])
        out[key] = (bw, lat)
    return out


def infer_regions(table: LinkTable, nodes: Sequence[str]) -> Regions:
    """Regions = connected components over the fast node-to-node links.

    A link is slow when its bandwidth lies below the widest gap (>= 4x) between the table's
    bandwidths, or its latency above the widest gap between its latencies; with no such gap
    every link is fast and the cluster is one region."""
    pairs = _pairs(table, nodes)
    bw_cut = _gap_threshold([bw for bw, _ in pairs.values()])
    lat_cut = _gap_threshold([lat for _, lat in pairs.values()])
    parent = {n: n for n in nodes}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for key, (bw, lat) in pairs.items():
        if (bw_cut is None or bw >= bw_cut) and (lat_cut is None or lat <= lat_cut):
            a, b = sorted(key, key=nodes.index)
            parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for n in nodes:
        groups.setdefault(root(n), []).append(n)
    members = {f"region-{i}": tuple(g) for i, g in enumerate(groups.values())}
    rules = []
    if bw_cut is not None:
        rules.append(f"bandwidth >= {format_bandwidth(float(f'{bw_cut:.3g}'))}")
    if lat_cut is not None:
        rules.append(f"latency <= {format_duration(float(f'{lat_cut:.3g}'))}")
    how = ("one region (the node-to-node links show no gap of 4x or more)" if not rules else
           f"components over the links with {' and '.join(rules)} (the widest gap in the table)")
    return Regions(members, how)


def regions_from_mapping(data: Any, nodes: Sequence[str], source: str) -> Regions:
    """Regions a user wrote (region name -> list of node names); every node in exactly one."""
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{source}: expected a mapping of region name -> list of node names")
    known, seen = set(nodes), {}
    for region, names in data.items():
        if not isinstance(names, list) or not names:
            raise ValueError(f"{source}: region {region!r}: expected a non-empty list of node names")
        for name in names:
            name = str(name)
            if name not in known:
                raise ValueError(f"{source}: region {region!r}: unknown node {name!r} "
                                 f"(nodes are {nodes[0]} .. {nodes[-1]})")
            if name in seen:
                raise ValueError(f"{source}: node {name!r} is in regions {seen[name]!r} and "
                                 f"{region!r}")
            seen[name] = str(region)
    missing = [n for n in nodes if n not in seen]
    if missing:
        raise ValueError(f"{source}: no region for {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    members = {str(r): tuple(n for n in nodes if seen[n] == str(r)) for r in data}
    return Regions(members, f"as given in {source}")


# --- compaction ------------------------------------------------------------------------------------

def _typical(figures: Sequence[Figure]) -> Figure:
    """The lower median of bandwidth and of latency (an actual value, so many links match it)."""
    bws = sorted(bw for bw, _ in figures)
    lats = sorted(lat for _, lat in figures)
    return bws[(len(bws) - 1) // 2], lats[(len(lats) - 1) // 2]


def _differs(fig: Figure, ref: Figure | None, tolerance: float) -> bool:
    """Whether ``fig`` is off ``ref`` by more than ``tolerance`` (relative) in either figure."""
    return ref is None or any(abs(x - r) > tolerance * r for x, r in zip(fig, ref))


def _link(fig: Figure) -> dict[str, str]:
    return {"bandwidth": f"{fig[0]!r}B/s", "latency": f"{fig[1]!r}s"}


def compact(table: LinkTable, nodes: Sequence[str], regions: Regions,
            tolerance: float = 0.0) -> dict[str, Any]:
    """Spec fields (``regions``, ``inter_region``, ``region_links``, ``coordinator``, ``links``,
    ``only_listed_links``) describing ``table`` on these regions.

    A table that lacks a pair is written as the full list of its links with ``only_listed_links``
    (region figures would connect the missing pairs)."""
    names = list(regions.members)
    region_of = {n: r for r, ms in regions.members.items() for n in ms}
    intra: dict[str, list[Figure]] = {r: [] for r in names}
    cross: dict[frozenset[str], list[Figure]] = {}
    for (a, b), fig in table.items():
        if COORDINATOR in (a, b):
            continue
        ra, rb = region_of[a], region_of[b]
        if ra == rb:
            intra[ra].append(fig)
        else:
            cross.setdefault(frozenset((ra, rb)), []).append(fig)
    # A one-node region has no link inside; it gets the typical intra-region figure.
    fallback = [f for figs in intra.values() for f in figs] or list(table.values())
    region_fig = {r: _typical(figs or fallback) for r, figs in intra.items()}
    inter = _typical([f for figs in cross.values() for f in figs]) if cross else None
    pair_fig = {key: f for key, figs in cross.items()
                if _differs(f := _typical(figs), inter, tolerance)}
    home, out_fig, in_fig = _coordinator(table, nodes, region_of, region_fig, tolerance)

    def default(a: str, b: str) -> Figure | None:
        # What ClusterSpec.link gives without an override: the coordinator's own figures, else
        # (as for any vertex) its region's, the region pair's or the inter-region default.
        if COORDINATOR in (a, b):
            fig = out_fig if a == COORDINATOR else in_fig
            if fig is not None:
                return fig
        ra, rb = (region_of.get(v, home) for v in (a, b))
        return region_fig[ra] if ra == rb else pair_fig.get(frozenset((ra, rb)), inter)

    vertices = [COORDINATOR, *nodes]
    complete = all((a, b) in table for a in vertices for b in vertices if a != b)
    out: dict[str, Any] = {"regions": {r: _link(f) for r, f in region_fig.items()}}
    if inter is not None:
        out["inter_region"] = _link(inter)
    if pair_fig:
        out["region_links"] = [{"regions": sorted(key, key=names.index), **_link(f)}
                               for key, f in pair_fig.items()]
    out["coordinator"] = {"region": home}
    if not complete:  # every link listed; no figure would be used
        out["links"] = _overrides(table, vertices, lambda a, b: None, tolerance)
        out["only_listed_links"] = True
        return out
    out["coordinator"].update({"outbound": _link(out_fig)} if out_fig else {},
                              **({"inbound": _link(in_fig)} if in_fig else {}))
    out["links"] = _overrides(table, vertices, default, tolerance)
    return out


def _coordinator(table: LinkTable, nodes: Sequence[str], region_of: dict[str, str],
                 region_fig: dict[str, Figure], tolerance: float
                 ) -> tuple[str, Figure | None, Figure | None]:
    """The coordinator's region (the one its outbound links reach fastest) and its outbound and
    inbound figures where they differ from that region's own (else None)."""
    outs = [n for n in nodes if (COORDINATOR, n) in table]
    ins = [n for n in nodes if (n, COORDINATOR) in table]
    by_region: dict[str, list[Figure]] = {}
    for n in outs:
        by_region.setdefault(region_of[n], []).append(table[(COORDINATOR, n)])
    order = list(region_fig)
    home = max(by_region, key=lambda r: (_typical(by_region[r])[0], -order.index(r)),
               default=order[0])
    figs = []
    for arcs in ([(COORDINATOR, n) for n in outs], [(n, COORDINATOR) for n in ins]):
        fig = _typical([table[arc] for arc in arcs]) if arcs else None
        figs.append(fig if fig is not None and _differs(fig, region_fig[home], tolerance) else None)
    return home, figs[0], figs[1]


def _overrides(table: LinkTable, vertices: Sequence[str], default, tolerance: float
               ) -> list[dict[str, Any]]:
    """``between`` entries for pairs equal both ways, ``from``/``to`` entries otherwise; only
    where the figure differs from ``default(a, b)`` (None: always)."""
    out: list[dict[str, Any]] = []
    for i, a in enumerate(vertices):
        for b in vertices[i + 1:]:
            ab, ba = table.get((a, b)), table.get((b, a))
            if ab is not None and ab == ba:
                if _differs(ab, default(a, b), tolerance) or _differs(ba, default(b, a), tolerance):
                    out.append({"between": [a, b], **_link(ab)})
                continue
            for src, dst, fig in ((a, b, ab), (b, a, ba)):
                if fig is not None and _differs(fig, default(src, dst), tolerance):
                    out.append({"from": src, "to": dst, **_link(fig)})
    return out
