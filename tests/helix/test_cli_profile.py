"""``helix profile``: measures the serving engine, writes a profile ``helix plan`` reads back."""

import dataclasses
import json

import pytest
import yaml

from helix.cli import main
from helix.core.costmodel import CostModel
from helix.core.profiles import load_profile
from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.workload import TraceRequest
from helix.core.spec import load_cluster

pytest.importorskip("torch")

ONE_NODE = """\
model: tiny-llama
dtype: float32
workload: {mean_prompt_tokens: 48, mean_output_tokens: 16}
serving: {max_batch_seqs: 4}
regions:
  local: {bandwidth: 1GB/s, latency: 100us}
nodes:
  - {name: cpu-0, gpu: CPU, memory: 64MiB}
performance:
  profiles: {CPU: measured}
"""


def test_quick_profile_is_what_plan_reads(tmp_path, capsys):
    folder = tmp_path / "measured"
    assert main(["profile", "tiny-llama", "--quick", "--threads", "1", "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {folder}" in out and "performance: {profiles: {CPU:" in out
    meta = yaml.safe_load((folder / "profile.yaml").read_text())
    assert (meta["device"], meta["dtype"], meta["torch_threads"]) == ("cpu", "float32", 1)
    assert meta["model"]["name"] == "tiny-llama" and meta["step_overhead_ms"]["decode"]
    profile = load_profile(folder, "CPU")
    # The quick grid: prompt lengths 16 and 64 batched up to 128 tokens; 1 and 4 decodes at 16, 64.
    assert [(r.batch, r.context) for r in profile.prompt.rows()] == \
        [(16, 16), (32, 16), (64, 16), (128, 16), (64, 64), (128, 64)]
    assert [(r.batch, r.context) for r in profile.decode.rows()] == [(1, 16), (4, 16), (1, 64), (4, 64)]
    assert all(r.seconds > 0 for r in profile.prompt.rows() + profile.decode.rows())
    # A last stage's fixed cost (LM head, sampling) measured apart, at the same points.
    assert [(r.batch, r.context) for r in profile.last_prompt_overhead.rows()] == \
        [(r.batch, r.context) for r in profile.prompt_overhead.rows()]
    assert [(r.batch, r.context) for r in profile.last_decode_overhead.rows()] == \
        [(r.batch, r.context) for r in profile.decode_overhead.rows()]
    assert all(r.seconds > 0 for r in profile.last_decode_overhead.rows())

    spec_path = tmp_path / "one.yaml"
    spec_path.write_text(ONE_NODE)
    spec = load_cluster(spec_path)
    node = spec.nodes[0]
    cost = CostModel.for_cluster(spec)
    # The plan's node capacity comes from the measured figures, not the roofline: 8 layers and
    # the step's fixed cost.
    point = cost.operating_point(node, 8)
    args = (point.prompt_tokens, point.decode_seqs, 48 + 16 / 2, 48 / 2)
    fixed = profile.step_overhead_s(*args)
    assert fixed > 0 and point.step_s == pytest.approx(8 * profile.layer_time_s(*args) + fixed)
    plan_path = tmp_path / "plan.yaml"
    assert main(["plan", str(spec_path), "--json", "--threads", "1", "--time-limit", "5",
                 "-o", str(plan_path)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["placements"] == [{"node": "cpu-0", "start": 0, "end": 8}]
    assert plan["max_flow_tokens_per_s"] == pytest.approx(cost.throughput_tokens_per_s(node, 8))

    # The simulator charges a step its 8 measured layers plus the step's measured fixed cost, a
    # last stage's (cpu-0 holds the whole model: it samples).
    from helix.core.plan import Plan
    from worker.step_policy import StepPlan
    sim = build_simulator(spec, Plan.load(plan_path), (TraceRequest(0.0, 8, 2),),
                          SimConfig(duration_s=None))
    step = StepPlan(decode_ids=("a", "b"), decode_positions=(40, 60))
    fixed = profile.step_overhead_s(0, 2, 50, 0)
    assert fixed > 0 and cost.step_overhead_s(node, 0, 2, 50, 0) == fixed
    last = profile.step_overhead_s(0, 2, 50, 0, last=True)
    assert last == pytest.approx(profile.last_decode_overhead(2, 50))
    assert sim.workers["cpu-0"].step_time_s(step) == pytest.approx(
        8 * profile.layer_time_s(0, 2, 50, 0) + last)


def test_a_checkpoint_folder_is_profiled_from_its_config(tmp_path, capsys):
    ckpt = tmp_path / "my-llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3, "hidden_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
        "vocab_size": 100, "max_position_embeddings": 128}))
    assert main(["profile", str(ckpt), "--quick", "--threads", "1", "--layers", "1",
                 "-o", str(tmp_path / "p")]) == 0
    meta = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())
    assert meta["model"]["name"] == "my-llama" and meta["model"]["hidden_size"] == 32
    assert len(load_profile(tmp_path / "p", "CPU").decode.rows()) == 4


@pytest.mark.parametrize("name, gib, label", [
    ("NVIDIA A100-SXM4-80GB", 79.3, "A100-80G"), ("NVIDIA A100-PCIE-40GB", 39.4, "A100-40G"),
    ("NVIDIA H100 80GB HBM3", 79.1, "H100-80G"), ("NVIDIA L4", 22.0, "L4"), ("Tesla T4", 14.7, "T4"),
    ("Tesla V100-SXM2-32GB", 31.7, "V100-32G"), ("NVIDIA GeForce RTX 4090", 23.6, "RTX4090"),
    ("NVIDIA A10G", 22.0, "A10G"), ("Some Future GPU", 100.0, "LABEL"),
])
def test_the_suggested_label_names_the_catalog_gpu(name, gib, label):
    from helix.commands.profile import gpu_label
    assert gpu_label(name, gib * 2**30) == label


@pytest.mark.parametrize("args, message", [
    (["--seqs", "1,x"], "--seqs '1,x': expected positive integers"),
    (["--dtype", "int8"], "--dtype 'int8': known: auto, float16"),
    (["--device", "tpu"], "--device 'tpu': expected auto, cpu, cuda or cuda:N"),
    (["--seqs", "1", "--reps", "600"], "nothing to measure: model 'tiny-llama' holds 512"),
])
def test_bad_options_are_one_line(tmp_path, capsys, args, message):
    assert main(["profile", "tiny-llama", "--quick", "-o", str(tmp_path / "p"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "p").exists()


def test_the_grid_fits_the_model_and_the_memory():
    from helix.core.errors import HelixUserError
    from helix.core.models import MODEL_CATALOG
    from worker.profile import ProfileGrid
    spec = MODEL_CATALOG["llama-1-30b"]                       # 2048 positions, no GQA
    grid = ProfileGrid.default("cuda").fit_to(spec.max_position_embeddings)
    assert grid.decode_contexts == (256, 1024, 2048 - grid.decode_advance)
    assert grid.fit_memory(spec, 2, False, 80 * 2**30).layers == 4
    small = grid.fit_memory(spec, 2, False, 24 * 2**30)       # an L4: fewer layers, same grid
    more = dataclasses.replace(small, layers=small.layers + 1)
    assert small.layers < 4 and small.decode_points() == grid.decode_points()
    assert small.bytes_needed(spec, 2, False) <= 0.9 * 24 * 2**30 < more.bytes_needed(spec, 2, False)
    with pytest.raises(HelixUserError, match=r"GiB for one layer .* 5.0 GiB are free: lower --seqs"):
        grid.fit_memory(spec, 2, False, 5 * 2**30)
