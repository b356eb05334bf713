"""Regions as the links show them, for specs whose declared regions the links contradict.

The planner's multi-region searches and bounds (region chains, aligned chains, the crossing and
sharing bounds, per-region sub-solves, KV stage chains over regions) key on each node's region. A
cluster described by its per-pair links under one region label (or under labels that cut across
its fast groups) would hide that structure: its slow links would only show in the flow.

:func:`planning_spec` finds the regions in the link table (:func:`helix.core.link_table
.infer_regions`: connected components over the fast links) and, where they differ from the declared
ones, returns the same cluster with those regions: the same nodes and exactly the same link
between every pair (written with :func:`helix.core.link_table.compact` at tolerance 0), only the
region labels (and the region figures the links no longer need) changed. A spec whose declared
regions match its links is returned as it is, so its plans do not change.

Only specs with per-pair links are looked at: without them every link is its regions' own figure
(capped by NICs, which cap one node's links, not a region's), so the declared regions are what the
links say.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from helix.core.link_table import Figure, Regions, compact, infer_regions
from helix.core.plan import COORDINATOR
from helix.core.spec import ClusterSpec, parse_cluster

#: Spec fields that describe the network; the relabeled spec takes them from ``compact``.
_NETWORK_FIELDS = ("regions", "inter_region", "region_links", "links", "only_listed_links")


@dataclass(frozen=True)
class InferredRegions:
    """Regions the planner took from the links instead of the declared ones."""

    regions: Regions
    declared: int
    """How many regions the spec declares (that its nodes use)."""

    def to_extras(self) -> dict:
        """What a plan's ``extras["regions"]`` carries (:func:`summary` reads it)."""
        return {"inferred_from_links": {r: list(ms) for r, ms in self.regions.members.items()},
                "declared": self.declared, "how": self.regions.how}


def summary(extras: dict) -> str:
    """One line for people from :meth:`InferredRegions.to_extras`: ``inferred from the links: 3
    (region-0: 4 nodes, ...); the spec declares 1``."""
    members = extras["inferred_from_links"]
    parts = ", ".join(f"{r}: {len(ms)} node{'s' if len(ms) != 1 else ''}"
                      for r, ms in members.items())
    return (f"inferred from the links: {len(members)} ({parts}); the spec declares "
            f"{extras['declared']}")


def link_table(spec: ClusterSpec) -> dict[tuple[str, str], Figure]:
    """Every connected ordered pair of vertices (nodes and the coordinator) and its
    (bandwidth bytes/s, latency s), NIC limits applied."""
    vertices = [COORDINATOR, *(n.name for n in spec.nodes)]
    table = {}
    for a in vertices:
        for b in vertices:
            params = spec.link(a, b) if a != b else None
            if params is not None:
                table[(a, b)] = (params.bandwidth_bytes_per_s, params.latency_s)
    return table


def _partition(groups) -> set[frozenset[str]]:
    return {frozenset(g) for g in groups}


def infer(spec: ClusterSpec) -> tuple[dict[tuple[str, str], Figure], InferredRegions] | None:
    """The link table and the regions it shows, when those differ from the declared regions;
    None when they match or the spec has no per-pair links (module docstring)."""
    if not spec.links:
        return None
    names = [n.name for n in spec.nodes]
    table = link_table(spec)
    found = infer_regions(table, names)
    declared: dict[str, list[str]] = {}
    for n in names:
        declared.setdefault(spec.region_of(n), []).append(n)
    if _partition(found.members.values()) == _partition(declared.values()):
        return None
    return table, InferredRegions(found, len(declared))


_known: dict[int, tuple[weakref.ref, tuple[ClusterSpec, InferredRegions] | None]] = {}
"""What :func:`planning_spec` found for each spec still alive, by ``id`` (specs are frozen but
not hashable): the planner asks for one spec several times a plan (the problem, the prediction,
the choice), and the link table of a large cluster with per-pair links is N^2 lookups."""


def _remember(spec: ClusterSpec, found: tuple[ClusterSpec, InferredRegions] | None) -> None:
    key = id(spec)
    _known[key] = (weakref.ref(spec, lambda _, key=key: _known.pop(key, None)), found)


def planning_spec(spec: ClusterSpec) -> tuple[ClusterSpec, InferredRegions | None]:
    """``spec`` with the regions its links show (module docstring), and what was inferred; ``spec``
    itself and None when its declared regions match its links. Worked out once per spec object;
    the relabelled spec is known to match its links."""
    hit = _known.get(id(spec))
    if hit is not None and hit[0]() is spec:
        return (spec, None) if hit[1] is None else hit[1]
    found = _relabelled(spec)
    _remember(spec, found)
    if found is not None:
        _remember(found[0], None)
    return (spec, None) if found is None else found


def _relabelled(spec: ClusterSpec) -> tuple[ClusterSpec, InferredRegions] | None:
    found = infer(spec)
    if found is None:
        return None
    table, inferred = found
    names = [n.name for n in spec.nodes]
    data = {k: v for k, v in spec.to_dict().items() if k not in _NETWORK_FIELDS}
    network = compact(table, names, inferred.regions, tolerance=0.0)
    coordinator = {k: v for k, v in data.get("coordinator", {}).items()
                   if k not in ("region", "outbound", "inbound")}
    data["coordinator"] = {**coordinator, **network.pop("coordinator")}
    data.update(network)
    region_of = {n: r for r, ms in inferred.regions.members.items() for n in ms}
    data["nodes"] = [{**node, "region": region_of[node["name"]]} for node in data["nodes"]]
    return parse_cluster(data, source="the spec with regions from its links",
                         base_dir=spec._base_dir), inferred
