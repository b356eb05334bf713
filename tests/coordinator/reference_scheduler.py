"""The request schedulers as they were before the decision path was made incremental (commit
3af1c46), kept as an oracle: whole-graph reachability for every decision, ``fits`` on every node.

Only the walk, the KV bookkeeping and the choice rules are re-implemented here; the arcs and ranges
are read from the real schedulers' topologies, so the oracle checks decisions, not arc building.
"""

from __future__ import annotations

import random

from coordinator.iwrr import IWRR
from coordinator.schedulers import HelixScheduler, RandomScheduler, Scheduler, SwarmScheduler
from helix.core.plan import COORDINATOR, Plan


class ReferenceKV:
    def __init__(self, caps: dict[str, float], high_water: float) -> None:
        self.limit = {n: high_water * float(c) for n, c in caps.items()}
        self.cap = {n: float(c) for n, c in caps.items()}
        self.reserved = {n: 0.0 for n in caps}
        self.observed = {n: 0.0 for n in caps}
        self.by_request: dict = {}

    def used(self, node):
        return max(self.reserved[node], self.observed[node])

    def usage_fraction(self, node):
        return self.used(node) / self.cap[node] if self.cap[node] > 0 else 1.0

    def fits(self, node, token_layers):
        return self.used(node) + token_layers <= self.limit[node]

    def reserve(self, rid, amounts):
        self.release(rid)
        amounts = tuple(amounts)
        for node, x in amounts:
            self.reserved[node] += x
        self.by_request[rid] = amounts

    def release(self, rid):
        for node, x in self.by_request.pop(rid, ()):
            left = self.reserved[node] - x
            self.reserved[node] = left if left > 1e-6 else 0.0

    def observe(self, node, used):
        self.observed[node] = float(used)


def reference_walk(topology, choose, allowed):
    ok: set[str] = set()
    for node in sorted(topology.ranges, key=lambda n: -topology.ranges[n][1]):
        if allowed(node) and any(w == COORDINATOR or w in ok for w in topology.arcs[node]):
            ok.add(node)
    stages, here = [], COORDINATOR
    while True:
        if here != COORDINATOR and topology.ranges[here][1] == topology.num_layers \
                and COORDINATOR in topology.arcs[here]:
            return tuple(stages)
        candidates = [w for w in topology.arcs[here] if w in ok]
        if not candidates:
            return None
        nxt = choose(here, candidates)
        stages.append(topology.stage(here, nxt))
        here = nxt


class ReferenceScheduler:
    """Decisions of ``real`` (same kind, same topologies) made the pre-change way."""

    def __init__(self, real: Scheduler, plan: Plan, kv: ReferenceKV, seed: int = 0) -> None:
        self.name, self.kv = real.name, kv
        self.topologies = [real.topology] + ([real.fallback] if getattr(real, "fallback", None)
                                             else [])
        self.assigned = {n: 0 for t in self.topologies for n in t.ranges}
        self.pipelines: dict = {}
        self.delays: dict = {}
        self.priority: dict = {}
        self.rng = random.Random(seed)
        self.iwrr = {}
        if isinstance(real, HelixScheduler):
            flows = {(a.src, a.dst): a.flow_tokens_per_s for a in plan.arc_flows}
            for v, outs in real.topology.arcs.items():
                weights = {w: flows.get((v, w), 0.0) for w in outs}
                if any(x > 0 for x in weights.values()):
                    self.iwrr[v] = IWRR(weights)
        assert isinstance(real, (HelixScheduler, RandomScheduler, SwarmScheduler)) \
            or real.name == "shortest-queue"

    def _choose(self, vertex, candidates):
        if self.name == "helix":
            return self.iwrr[vertex].pick(candidates)
        if self.name == "random":
            return candidates[self.rng.randrange(len(candidates))]
        if self.name == "shortest-queue":
            return min(candidates, key=lambda n: self.assigned.get(n, 0))
        # SWARM's interleaved weighted round robin: lowest priority first, which grows by the
        # hop's delay average at every pick.
        w = min(candidates, key=lambda c: self.priority.get((vertex, c), 0.05))
        self.priority[(vertex, w)] = self.priority.get((vertex, w), 0.05) + \
            self.delays.get((vertex, w), 0.05)
        return w

    def _choose_fallback(self, vertex, candidates):
        iwrr = self.iwrr.get(vertex)
        pick = iwrr.pick(candidates) if iwrr is not None else None
        return pick if pick is not None else min(candidates, key=self.kv.usage_fraction)

    def schedule(self, rid, tokens):
        for topo, choose in zip(self.topologies, (self._choose, self._choose_fallback)):
            ranges = topo.ranges
            layers = lambda n: ranges[n][1] - ranges[n][0]  # noqa: E731
            stages = reference_walk(topo, choose, lambda n: self.kv.fits(n, tokens * layers(n)))
            if stages is not None:
                self.kv.reserve(rid, ((s.node, tokens * layers(s.node)) for s in stages))
                for s in stages:
                    self.assigned[s.node] += 1
                self.pipelines[rid] = stages
                return stages
        return None

    def release(self, rid):
        stages = self.pipelines.pop(rid, None)
        if stages is not None:
            self.kv.release(rid)
            for s in stages:
                self.assigned[s.node] -= 1

    def observe_hop(self, src, dst, delay_s, smoothing=0.8):
        old = self.delays.get((src, dst), 0.05)
        self.delays[(src, dst)] = old + smoothing * (delay_s - old)
