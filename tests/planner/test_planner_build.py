"""planner.build: the links of the placement problem are exactly what the spec says per pair."""

from __future__ import annotations

import pytest

from helix.core.plan import COORDINATOR
from helix.core.spec import parse_cluster
from planner.build import build_links, token_id_bytes
from tests.builders.specs import tiny_spec


def naive_links(spec):
    """The definition: every ordered pair asked of the spec on its own."""
    model = spec.model
    names = [COORDINATOR, *(n.name for n in spec.nodes)]
    out = {}
    for a in names:
        for b in names:
            params = None if a == b else spec.link(a, b)
            if params is not None:
                per_token = token_id_bytes(model) if COORDINATOR in (a, b) else \
                    max(model.activation_bytes_per_token(spec.dtype_bytes), token_id_bytes(model))
                out[(a, b)] = (params.bandwidth_bytes_per_s / per_token, params.latency_s)
    return out


@pytest.mark.parametrize("only_listed", [False, True])
def test_shared_links_equal_the_per_pair_definition(only_listed):
    spec = parse_cluster(tiny_spec(
        regions={"east": {"bandwidth": "10Gbps", "latency": "1ms"},
                 "west": {"bandwidth": "5Gbps", "latency": "2ms"},
                 "south": {"bandwidth": "10Gbps", "latency": "1ms"}},
        region_links=[{"regions": ["east", "south"], "bandwidth": "300Mbps", "latency": "70ms"}],
        coordinator={"region": "east", "inbound": {"bandwidth": "1Gbps", "latency": "3ms"},
                     "nic_bandwidth": "2Gbps"},
        nodes=[{"name": "a-{i}", "gpu": "A100-40G", "count": 3, "region": "east"},
               {"name": "a-nic", "gpu": "A100-40G", "region": "east", "nic_bandwidth": "1Gbps"},
               {"name": "l-{i}", "gpu": "L4", "count": 3, "region": "west"},
               {"name": "t-{i}", "gpu": "T4", "count": 2, "region": "south"}],
        links=[{"between": ["a-0", "l-1"], "bandwidth": "40Mbps", "latency": "90ms"},
               {"from": "t-1", "to": "a-2", "bandwidth": "20Mbps", "latency": "9ms"},
               {"between": ["coordinator", "l-0"], "bandwidth": "7Mbps"},
               {"between": ["a-1", "a-2"], "bandwidth": "1Gbps"}],
        only_listed_links=only_listed))
    got = {pair: (link.capacity_tokens_per_s, link.latency_s)
           for pair, link in build_links(spec, spec.model).items()}
    want = naive_links(spec)
    assert got == want
    assert len(want) == (7 if only_listed else 10 * 9)  # the listed pairs / every ordered pair
