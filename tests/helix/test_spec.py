import copy

import pytest
import yaml

from helix.core.errors import SpecError
from helix.core.plan import COORDINATOR
from helix.core.spec import load_cluster, parse_cluster
from tests.conftest import CLUSTER_SPECS

from tests.builders.specs import tiny_spec


def test_valid_spec_expands_groups_and_resolves_model():
    spec = parse_cluster(tiny_spec())
    assert [n.name for n in spec.nodes] == ["a100-0", "a100-1", "a100-2", "a100-3", "l4-0"]
    assert spec.model.num_layers == 80
    assert spec.node("l4-0").label == "L4x2"
    assert spec.node("l4-0").vram_bytes == 2 * 24 * 2**30


def test_link_precedence():
    data = tiny_spec(region_links=[{"regions": ["east", "west"], "bandwidth": "1Gbps",
                                    "latency": "20ms"}],
                     links=[{"between": ["a100-0", "a100-1"], "bandwidth": "100Gbps"}])
    data["nodes"][1]["nic_bandwidth"] = "500Mbps"
    spec = parse_cluster(data)
    assert spec.link("a100-0", "a100-1").bandwidth_bytes_per_s == pytest.approx(12.5e9)
    assert spec.link("a100-2", "a100-3").latency_s == pytest.approx(1e-3)
    # region pair override beats the inter-region default
    assert spec.link("a100-2", "a100-3").bandwidth_bytes_per_s == pytest.approx(1.25e9)
    # NIC caps: the region-pair link is 1 Gb/s but l4-0's NIC is 500 Mb/s
    assert spec.link("l4-0", "a100-0").bandwidth_bytes_per_s == pytest.approx(62.5e6)
    assert spec.link("l4-0", "a100-0").latency_s == pytest.approx(0.02)
    assert spec.link(COORDINATOR, "a100-0").latency_s == pytest.approx(1e-3)


def test_regions_unconnected_without_inter_region():
    data = tiny_spec()
    del data["inter_region"]
    spec = parse_cluster(data)
    assert spec.link("l4-0", "a100-0") is None
    assert spec.link("a100-0", "a100-1") is not None


def test_yaml_round_trip_and_hash_is_content_based(tmp_path):
    spec = parse_cluster(tiny_spec())
    again = parse_cluster(yaml.safe_load(spec.to_yaml()))
    assert again == spec and again.content_hash() == spec.content_hash()
    other = parse_cluster(tiny_spec(dtype="bfloat16"))
    assert other.content_hash() != spec.content_hash()


def test_model_from_checkpoint_folder_relative_to_spec(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,'
        ' "num_hidden_layers": 5, "num_attention_heads": 4, "vocab_size": 99}')
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_spec(model="ckpt")))
    spec = load_cluster(tmp_path / "c.yaml")
    assert spec.model.num_layers == 5 and spec.model.vocab_size == 99


def _mutate(path, value):
    data = tiny_spec()
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()

# (mutation, expected fragment of the one-line error)
MALFORMED = [
    ((("nodes", 0, "gpu"), "A10O"), "nodes[0] (a100-0).gpu: unknown GPU 'A10O'; known: A100-40G"),
    ((("regions", "east", "bandwidth"), "10 parsecs"), "regions.east.bandwidth: unknown bandwidth unit"),
    ((("regions", "east", "bandwidth"), "10"), "has no unit"),
    ((("regions", "east", "bandwidth"), "0Gbps"), "regions.east.bandwidth"),
    ((("regions", "east", "bandwidth"), "-5Gbps"), "regions.east.bandwidth"),
    ((("regions", "east", "latency"), "-1ms"), "regions.east.latency"),
    ((("nodes", 1, "name"), "a100-0"), "nodes[1].name: duplicate node name 'a100-0'"),
    ((("nodes", 1, "region"), "mars"), "unknown region 'mars'; known: east, west"),
    ((("coordinator", "region"), "mars"), "coordinator.region: unknown region 'mars'"),
    ((("model",), _DELETE), "model: required field is missing"),
    ((("model",), "llama-9-900b"), "unknown model 'llama-9-900b'"),
    ((("nodes", 1, "gpus"), 0), "nodes[1].gpus"),
    ((("nodes", 0, "count"), -2), "count must be a positive integer"),
    ((("nodes", 0, "name"), "a100"), "needs '{i}' in its name"),
    ((("nodes", 1, "colour"), "red"), "nodes[1].colour: unknown field"),
    ((("dtype",), "float8"), "unknown dtype 'float8'"),
    ((("links",), [{"between": ["a100-0", "ghost"], "bandwidth": "1Gbps"}]),
     "links[0].between: unknown node 'ghost'"),
    ((("region_links",), [{"regions": ["east", "moon"], "bandwidth": "1Gbps"}]),
     "region_links[0].regions: unknown region 'moon'"),
    ((("nodes",), []), "nodes"),
    ((("performance",), {"throughput_tables": {"H100-80G": [1, 2]}}), "matches no node"),
    ((("performance",), {"throughput_tables": {"L4x2": []}}), "is empty"),
    ((("performance",), {"profiles": {"L4x2": "/no/such/dir"}}), "no such folder"),
    ((("workload", ), {"mean_prompt_tokens": -3}), "workload.mean_prompt_tokens"),
]


@pytest.mark.parametrize("mutation,fragment", MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_malformed_specs_give_one_clear_line(mutation, fragment):
    path, value = mutation
    with pytest.raises(SpecError) as err:
        parse_cluster(_mutate(path, value), source="c.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("c.yaml")
    assert fragment in message


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-2-70b\nnodes: [\n  {name: a, gpu: L4\n")
    with pytest.raises(SpecError, match=r"invalid YAML at line \d+, column \d+"):
        load_cluster(bad)


def test_top_level_not_a_mapping(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_cluster(bad)


def test_missing_file():
    with pytest.raises(SpecError, match="no such file"):
        load_cluster("/no/such/cluster.yaml")


def test_profile_bad_row(tmp_path):
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "prompt_bs2time.csv").write_text("0,0\n250,1\nabc,2\n")
    (prof / "decode_bs2time.csv").write_text("2,0.9\n")
    data = tiny_spec(performance={"profiles": {"A100-40G": str(prof)}})
    with pytest.raises(SpecError, match=r"prompt_bs2time.csv:3: bad profile row 'abc,2'"):
        parse_cluster(data)


def test_spec_is_frozen():
    spec = parse_cluster(tiny_spec())
    with pytest.raises(Exception):
        spec.dtype = "float32"
    assert copy.deepcopy(spec) == spec


def test_unquoted_numeric_gpu_alias():
    data = tiny_spec()
    data["nodes"][1]["gpu"] = 4090  # what YAML makes of `gpu: 4090`
    assert parse_cluster(data).node("l4-0").gpu == "RTX4090"


def test_plan_file_errors_are_one_line(tmp_path):
    from helix.core.plan import Plan
    bad = tmp_path / "p.yaml"
    bad.write_text("schema_version: 1\nplacements: [\n")
    with pytest.raises(SpecError, match=r"invalid YAML at line \d+") as err:
        Plan.load(bad)
    assert "\n" not in str(err.value)
    bad.write_text("schema_version: 1\nmodel: m\n")
    with pytest.raises(SpecError, match="missing field 'placements'"):
        Plan.load(bad)


def test_step_budget_too_small_for_one_decode_is_named():
    """serving.chunk_tokens below (p + o) / o leaves the cost model no decode per step: every T(k)
    was 0 and helix plan blamed 'memory limits'. The spec names the budget and the smallest one."""
    spec = tiny_spec(workload={"mean_prompt_tokens": 763, "mean_output_tokens": 232},
                     serving={"chunk_tokens": 4})
    with pytest.raises(SpecError, match=r"serving\.chunk_tokens: 4 .* 0 \(whole prompts\) or >= 5"):
        parse_cluster(spec)
    for ok in (0, 5, 2048):
        assert parse_cluster({**spec, "serving": {"chunk_tokens": ok}}).serving.chunk_tokens == ok


def test_the_default_step_budget_follows_a_prompt_heavy_workload():
    """The default budget (256) cannot hold a decode with its share of prompt tokens when prompts
    are ~1,000x the outputs: a spec that never set chunk_tokens gets the smallest power of two that
    does (and 'auto' the same floor); a budget the user set is still checked (one-line error)."""
    from helix.core.spec import step_budget_floor
    base = yaml.safe_load((CLUSTER_SPECS / "single24.yaml").read_text())
    base["workload"] = {"mean_prompt_tokens": 4000, "mean_output_tokens": 4}
    assert step_budget_floor(4000, 4) == 1001
    spec = parse_cluster(base)
    assert spec.serving.chunk_tokens == 1024 and not spec.serving.choose_chunk_tokens
    assert parse_cluster(spec.to_dict()) == spec
    auto = parse_cluster({**base, "serving": {"chunk_tokens": "auto"}})
    assert auto.serving.chunk_tokens == 1024 and auto.serving.choose_chunk_tokens
    with pytest.raises(SpecError, match=r"chunk_tokens: 512 cannot hold .* >= 1001"):
        parse_cluster({**base, "serving": {"chunk_tokens": 512}})
    default = parse_cluster(yaml.safe_load((CLUSTER_SPECS / "single24.yaml").read_text()))
    assert default.serving.chunk_tokens == 256


def test_the_step_budget_is_read_in_one_place():
    """``serving.chunk_tokens`` as written: unset and ``auto`` take the default (``auto`` also has
    the planner choose); a number, or a value the field then refuses, stays as written. A plan's
    serving section without it reads as the engine's own budget (plans written before the field)."""
    from helix.core import serving
    assert serving.resolve_step_budget({}) == {"chunk_tokens": serving.DEFAULT_STEP_TOKENS}
    assert serving.resolve_step_budget({"chunk_tokens": "auto"}, 1024) == \
        {"chunk_tokens": 1024, "choose_chunk_tokens": True}
    for written in (0, 512, None, "lots"):
        assert serving.sets_step_budget({"chunk_tokens": written})
        assert serving.resolve_step_budget({"chunk_tokens": written}) == {"chunk_tokens": written}
    assert serving.ServingSpec().chunk_tokens == serving.DEFAULT_STEP_TOKENS == 256
    assert serving.ServingSpec(chunk_tokens="auto").choose_chunk_tokens
    assert serving.ServingSpec(chunk_tokens=512).choose_chunk_tokens is None
    old = serving.ServingLimits.from_dict({"dtype": "float16", "gpu_memory_utilization": 0.9,
                                   "max_batch_seqs": 8, "kv_high_water": 0.9,
                                   "block_size_tokens": 16, "kv_capacity_tokens": {}})
    assert old.chunk_tokens == serving.ENGINE_STEP_TOKENS == 512
