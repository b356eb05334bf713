"""Property: any valid spec dumps to YAML and reads back identical (same hash)."""

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helix.core.hardware import GPU_CATALOG
from helix.core.spec import parse_cluster

regions = st.lists(st.sampled_from(["east", "west", "eu", "ap"]), min_size=1, max_size=4,
                   unique=True)
bandwidth = st.builds(lambda v, u: f"{v:g}{u}", st.floats(0.01, 400, allow_nan=False),
                      st.sampled_from(["Gbps", "Mbps", "GB/s", "MiB/s"]))
latency = st.builds(lambda v, u: f"{v:g}{u}", st.floats(0, 300, allow_nan=False),
                    st.sampled_from(["ms", "us", "s"]))


@st.composite
def specs(draw):
    names = draw(regions)
    data = {
        "model": draw(st.sampled_from(["llama-2-70b", "llama-3-8b", "tiny-llama"])),
        "dtype": draw(st.sampled_from(["float16", "bfloat16", "float32"])),
        "regions": {r: {"bandwidth": draw(bandwidth), "latency": draw(latency)} for r in names},
        "workload": {"mean_prompt_tokens": draw(st.integers(1, 4096)),
                     "mean_output_tokens": draw(st.integers(1, 2048))},
        "nodes": [],
    }
    if draw(st.booleans()):
        data["inter_region"] = {"bandwidth": draw(bandwidth), "latency": draw(latency)}
    for i in range(draw(st.integers(1, 6))):
        node = {"name": f"n{i}", "gpu": draw(st.sampled_from(sorted(GPU_CATALOG))),
                "gpus": draw(st.sampled_from([1, 2, 4, 8])), "region": draw(st.sampled_from(names))}
        if draw(st.booleans()):
            node["nic_bandwidth"] = draw(bandwidth)
        data["nodes"].append(node)
    if len(data["nodes"]) > 1 and draw(st.booleans()):
        data["links"] = [{"between": ["n0", "n1"], "bandwidth": draw(bandwidth),
                          "latency": draw(latency)}]
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_round_trip(data):
    spec = parse_cluster(data)
    again = parse_cluster(yaml.safe_load(spec.to_yaml()))
    assert again == spec
    assert again.content_hash() == spec.content_hash()
    for a in spec.nodes:
        for b in spec.nodes:
            assert spec.link(a.name, b.name) == again.link(a.name, b.name)
