"""Property tests: on random placements every pipeline covers each layer exactly once, and no
scheduler ever reserves KV past a node's high-water mark."""

from hypothesis import given, settings, strategies as st

from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import RequestInfo
from coordinator.schedulers import SCHEDULERS, make_scheduler
from helix.core.plan import COORDINATOR
from tests.builders.plans import make_plan

NUM_LAYERS = 12


@st.composite
def placements(draw):
    """3-7 nodes with random ranges; a chain of them always covers every layer."""
    n = draw(st.integers(3, 7))
    cuts = sorted(draw(st.sets(st.integers(1, NUM_LAYERS - 1), min_size=1, max_size=3)))
    bounds = [0, *cuts, NUM_LAYERS]
    ranges = {f"n{i}": (a, b) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}
    for i in range(len(ranges), n):
        start = draw(st.integers(0, NUM_LAYERS - 1))
        ranges[f"n{i}"] = (start, draw(st.integers(start + 1, NUM_LAYERS)))
    # Flows on every usable arc (the helix scheduler needs positive flows to walk).
    flows = {}
    for u, (_, ue) in [(COORDINATOR, (0, 0)), *ranges.items()]:
        for w, (ws, we) in ranges.items():
            if u != w and (ws <= ue < we if u != COORDINATOR else ws == 0):
                flows[(u, w)] = draw(st.floats(0.5, 10))
        if u != COORDINATOR and ue == NUM_LAYERS:
            flows[(u, COORDINATOR)] = 1.0
    caps = {name: draw(st.sampled_from([50.0, 400.0, 1e6])) * (e - s)
            for name, (s, e) in ranges.items()}
    return make_plan(NUM_LAYERS, ranges, flows), caps


@settings(max_examples=60, deadline=None)
@given(placements(), st.sampled_from(SCHEDULERS),
       st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=60))
def test_pipelines_cover_layers_once_and_kv_stays_under_high_water(pc, name, ops):
    plan, caps = pc
    kv = KVEstimator(caps, high_water=0.8)
    sched = make_scheduler(name, plan, kv, seed=1)
    live = []
    for rid, (tokens, release) in enumerate(ops):
        if release and live:
            sched.release(live.pop(0))
        p = sched.schedule(RequestInfo(rid, tokens, 5))
        if p is not None:
            p.check(NUM_LAYERS)
            live.append(rid)
        for node, cap in caps.items():
            assert kv.used(node) <= 0.8 * cap + 1e-6
    for rid in live:
        sched.release(rid)
    assert all(kv.used(n) == 0 for n in caps) and all(v == 0 for v in sched.assigned.values())
