"""Directed link overrides and the coordinator's outbound/inbound figures in the cluster spec."""

import networkx as nx
import pytest

from helix.core.errors import SpecError
from helix.core.plan import COORDINATOR
from helix.core.spec import parse_cluster
from tests.builders.specs import tiny_spec


def _bw(spec, a, b):
    return spec.link(a, b).bandwidth_bytes_per_s


def test_coordinator_figures_differ_by_direction():
    spec = parse_cluster(tiny_spec(coordinator={
        "region": "east", "outbound": {"bandwidth": "80Mbps", "latency": "20ms"},
        "inbound": {"bandwidth": "40Mbps", "latency": "30ms"}}))
    assert _bw(spec, COORDINATOR, "a100-0") == 1e7 and _bw(spec, "a100-0", COORDINATOR) == 5e6
    assert spec.link("l4-0", COORDINATOR).latency_s == pytest.approx(0.03)
    assert _bw(spec, "a100-0", "a100-1") == 1.25e9  # node pairs keep their region figures


def test_directed_override_wins_over_between_and_coordinator_figures():
    spec = parse_cluster(tiny_spec(
        coordinator={"region": "east", "outbound": {"bandwidth": "80Mbps"}},
        links=[{"between": ["a100-0", "l4-0"], "bandwidth": "1Gbps"},
               {"from": "l4-0", "to": "a100-0", "bandwidth": "8Mbps", "latency": "70ms"},
               {"from": "coordinator", "to": "a100-1", "bandwidth": "8Gbps"}]))
    assert _bw(spec, "a100-0", "l4-0") == 1.25e8 and _bw(spec, "l4-0", "a100-0") == 1e6
    assert spec.link("l4-0", "a100-0").latency_s == pytest.approx(0.07)
    assert _bw(spec, COORDINATOR, "a100-1") == 1e9 and _bw(spec, COORDINATOR, "a100-2") == 1e7
    assert _bw(spec, "a100-1", COORDINATOR) == 1.25e9  # no inbound figure: the region's


def test_directed_links_round_trip():
    data = tiny_spec(coordinator={"region": "east", "inbound": {"bandwidth": "40Mbps"}},
                     links=[{"from": "l4-0", "to": "a100-0", "bandwidth": "8Mbps"}])
    spec = parse_cluster(data)
    again = parse_cluster(spec.to_dict())
    assert again.to_dict() == spec.to_dict()
    assert spec.to_dict()["links"][0]["from"] == "l4-0"


@pytest.mark.parametrize("link,message", [
    ({"between": ["a100-0", "l4-0"], "from": "a100-0", "to": "l4-0", "bandwidth": "1Gbps"},
     "either 'between"),
    ({"from": "a100-0", "bandwidth": "1Gbps"}, "needs both 'from' and 'to'"),
    ({"bandwidth": "1Gbps"}, "either 'between"),
    ({"from": "a100-0", "to": "a100-0", "bandwidth": "1Gbps"}, "two different vertices"),
    ({"from": "a100-0", "to": "h100-9", "bandwidth": "1Gbps"}, r"links\[0\].to: unknown node 'h100-9'"),
])
def test_bad_directed_links_are_one_line_errors(link, message):
    with pytest.raises(SpecError, match=message) as err:
        parse_cluster(tiny_spec(links=[link]))
    assert "\n" not in str(err.value)


def test_asymmetric_coordinator_links_reach_the_flow_graph():
    """The inbound (node -> coordinator) arc binds; the planner's max flow equals networkx's on
    a graph built here from the spec's own figures."""
    from planner.build import build_problem, token_id_bytes
    from planner.flowgraph import max_flow
    spec = parse_cluster(tiny_spec(
        model="llama-2-7b", coordinator={"region": "east", "outbound": {"bandwidth": "8Mbps"},
                     "inbound": {"bandwidth": "4kbps"}},
        performance={"throughput_tables": {"A100-40G": [900.0] * 16, "L4x2": [500.0] * 16}}))
    problem = build_problem(spec)
    per_token = token_id_bytes(spec.model)
    assert problem.link(COORDINATOR, "a100-0").capacity_tokens_per_s == 1e6 / per_token
    assert problem.link("a100-0", COORDINATOR).capacity_tokens_per_s == 500 / per_token
    placement = {"a100-0": (0, 16), "a100-1": (16, 32), "l4-0": (16, 32)}
    g = nx.DiGraph()
    hidden = spec.model.activation_bytes_per_token(spec.dtype_bytes)
    g.add_edge("src", "a100-0", capacity=spec.link(COORDINATOR, "a100-0").bandwidth_bytes_per_s
               / per_token)
    g.add_edge("a100-0", "a100-0'", capacity=900.0)
    for n, cap in (("a100-1", 900.0), ("l4-0", 500.0)):
        g.add_edge("a100-0'", n, capacity=spec.link("a100-0", n).bandwidth_bytes_per_s / hidden)
        g.add_edge(n, n + "'", capacity=cap)
        g.add_edge(n + "'", "sink", capacity=spec.link(n, COORDINATOR).bandwidth_bytes_per_s
                   / per_token)
    expected = nx.maximum_flow_value(g, "src", "sink")
    assert expected == pytest.approx(2 * 500 / per_token)  # both inbound arcs bind
    assert max_flow(problem, placement).value_tokens_per_s == pytest.approx(expected)
