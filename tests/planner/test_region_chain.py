"""Region chains: where no region holds the model and one slow link carries less than a stage,
crossings need several links side by side."""

from __future__ import annotations

from planner import solve
from planner.flowgraph import max_flow
from planner.search import construct
from planner.search.baselines import WARM_STARTS
from planner.search.region_chain import region_chain
from tests.builders.problems import make_node, make_problem


def two_regions():
    """2 strong nodes in r0 (4 layers at most), 4 weak ones in r1, 10 layers, 60 tokens/s links
    between the regions: neither region holds the model, and one crossing link carries 60."""
    nodes = [make_node(f"a{i}", (400, 200, 130, 100), gpu="A", region="r0") for i in range(2)] + \
        [make_node(f"b{i}", (200, 100, 60), gpu="B", region="r1") for i in range(4)]
    return make_problem(nodes, 10, inter_region_cap=60.0)


def test_region_chain_crosses_on_several_links_and_beats_every_other_start():
    p = two_regions()
    placement = region_chain(p)
    value = max_flow(p, placement).value_tokens_per_s
    others = [f(p, 0) for f in WARM_STARTS.values()] + [
        construct.sweep(p, 0), construct.regional(p, 0), construct.stages(p, 0)]
    assert value > 2 * 60.0  # more than two crossing links could carry
    assert value > max(max_flow(p, o).value_tokens_per_s for o in others)
    senders = [n for n, (s, e) in placement.items() if p.node(n).region == "r0" and e < p.num_layers]
    receivers = [n for n, (s, e) in placement.items() if p.node(n).region == "r1"
                 and s <= max(placement[x][1] for x in senders) < e]
    assert len(receivers) >= 3


def test_solve_keeps_the_region_chain_and_single_region_clusters_get_none():
    p = two_regions()
    plan = solve(p, "milp", time_limit_s=10, threads=1)
    assert plan.max_flow_tokens_per_s >= 130.0 * (1 - 1e-9)
    single = make_problem([make_node(f"n{i}", (100, 50)) for i in range(3)], 4)
    assert region_chain(single) == {}


def test_3cluster24_crossing_stage_counts_what_its_nodes_would_hold_elsewhere(shared_data):
    """The crossing stage into a region is chosen for the layers the whole region then covers:
    three T4 x 4 layers into region 2 (the L4s keep 3 layers each) instead of three L4 x 6, so
    the A100s' T(9) = 1,754.4 binds (was 1,595.1 with the L4s at T(7) x 3)."""
    from helix.core.helix_ini import convert_ini, load_throughput_tables
    from planner.build import build_problem
    cases = shared_data / "reference_cases"
    tables = load_throughput_tables(cases / "throughput_tables.yaml", "3cluster24")
    p = build_problem(convert_ini(cases / "3cluster24.ini", cases / "machine_profiles_3cluster24.ini",
                                  "llama-2-70b", throughput_tables=tables).spec)
    assert max_flow(p, region_chain(p)).value_tokens_per_s >= 1754.0
