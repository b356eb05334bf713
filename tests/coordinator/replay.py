"""A seeded call-by-call replay of the real scheduler beside the whole-graph reference
(reference_scheduler.py), and the plans it runs on: random 42-node plans and hetero42's."""

from __future__ import annotations

import logging
import random

from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import RequestInfo
from coordinator.schedulers import make_scheduler
from helix.core.plan import COORDINATOR
from tests.builders.plans import make_plan
from tests.conftest import CLUSTER_SPECS
from tests.coordinator.reference_scheduler import ReferenceKV, ReferenceScheduler


def random_plan(seed: int, num_nodes: int = 42, num_layers: int = 80):
    """Random overlapping slices (some at layer 0, some at the last layer), flow on every usable arc."""
    rng = random.Random(seed)
    ranges = {}
    for i in range(num_nodes):
        size = rng.randint(4, 30)
        start = 0 if i < 5 else num_layers - size if i < 10 else rng.randint(0, num_layers - size)
        ranges[f"n{i}"] = (start, start + size)
    flows = {}
    for u, (_, ue) in [(COORDINATOR, (0, 0)), *ranges.items()]:
        for w, (ws, we) in ranges.items():
            if u != w and (ws <= ue < we if u != COORDINATOR else ws == 0) and rng.random() < 0.6:
                flows[(u, w)] = rng.choice([0.0, 1.0, rng.uniform(0.5, 10)])
        if u != COORDINATOR and ue == num_layers:
            flows[(u, COORDINATOR)] = 1.0
    return make_plan(num_layers, ranges, flows)


def hetero42_plan():
    logging.disable(logging.CRITICAL)
    from helix.core.spec import load_cluster
    from planner.build import build_problem
    from planner.solve import solve
    return solve(build_problem(load_cluster(CLUSTER_SPECS / "hetero42.yaml")),
                 method="petals")


def replay(plan, name: str, seed: int, steps: int = 3000) -> int:
    """Drive the real scheduler and the reference side by side; returns the number of admissions."""
    rng = random.Random(seed)
    high_water = rng.choice([0.9, 1.0])
    # Capacities for roughly 5-40 requests of ~1000 tokens, whole numbers so fits hit equality.
    caps = {p.node: rng.randint(5, 40) * 1000 * p.num_layers for p in plan.placements}
    kv = KVEstimator(caps, high_water=high_water)
    real = make_scheduler(name, plan, kv, seed=seed)
    ref = ReferenceScheduler(real, plan, ReferenceKV(caps, high_water), seed=seed)
    nodes, live, admitted = sorted(caps), [], 0
    for rid in range(steps):
        op = rng.random()
        if op < 0.55:
            tokens = rng.choice([1000, 1000, rng.randint(1, 4000)])
            out = rng.randint(0, tokens)
            got = real.schedule(RequestInfo(rid, tokens - out, out))
            want = ref.schedule(rid, tokens)
            assert (None if got is None else got.stages) == want, (name, seed, rid)
            if got is not None:
                live.append(rid)
                admitted += 1
        elif op < 0.85 and live:
            rid_done = live.pop(rng.randrange(len(live)))
            real.release(rid_done)
            ref.release(rid_done)
        elif op < 0.92:
            node = rng.choice(nodes)
            used = rng.choice([0.0, kv.used(node), rng.uniform(0, 1.1 * caps[node])])
            kv.observe(node, used)
            ref.kv.observe(node, used)
        elif op < 0.96:   # a reservation made outside the scheduler, later replaced or dropped
            key = ("external", rng.randrange(3))
            amounts = [(n, float(rng.randint(0, 20_000))) for n in rng.sample(nodes, 3)]
            if rng.random() < 0.7:
                kv.reserve(key, amounts)
                ref.kv.reserve(key, amounts)
            else:
                kv.release(key)
                ref.kv.release(key)
        else:
            src, dst = rng.choice([(COORDINATOR, n) for n in nodes] + [(a, b) for a in nodes[:6]
                                                                         for b in nodes[6:12]])
            delay = rng.uniform(0.001, 0.2)
            real.observe_hop(src, dst, delay)
            ref.observe_hop(src, dst, delay)
        assert real.assigned == {n: ref.assigned.get(n, 0) for n in real.assigned}
    assert all(kv.used(n) == ref.kv.used(n) for n in nodes)
    return admitted
