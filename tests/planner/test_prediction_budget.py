"""The prediction under a small step budget: a wave of decodes bigger than the budget takes
several steps (the step policy cuts it), so the prediction must not starve the prompts."""

from __future__ import annotations

from pathlib import Path

from helix.core.costmodel import CostModel
from helix.core.plan import ArcFlow, Plan
from helix.core.serving import UNCHUNKED_STEP_TOKENS
from helix.core.slices import LayerSlice
from helix.core.spec import ClusterSpec, load_cluster
from planner.budget import at_budget
from planner.build import build_problem
from planner.predicted import evaluate
from planner.prediction import predict
from planner.prediction.model import Model
from planner.search.baselines import uniform

REFERENCE = Path(__file__).resolve().parents[2] / "cluster_specs" / "reference" / \
    "helix-single24-70b.yaml"


def test_a_wave_bigger_than_the_budget_takes_more_steps_not_fewer_prompts():
    """The reference planner's single24 (its T(k) tables; one 24-stage pipeline holding ~660
    requests, two waves of ~330 decodes each): at a 256-token budget the old prediction let a
    step hold the whole wave, left one token of room for prompts and predicted 16.8 decode
    tokens/s (264 at 288, 324 at 320); the simulator serves 432 at 256 (300 s offline, in-order
    trace, fill included). Now steps follow the tokens a node must carry per second / the budget:
    477 at 256, at most the T(k) capacity (2,046 tokens/s prompt + decode)."""
    spec = load_cluster(REFERENCE)
    problem = build_problem(spec)
    plan = evaluate(spec, uniform(problem), problem=problem)
    by_budget = {c: predict(at_budget(spec, c), plan)[0] for c in (256, 288, 320, 512)}
    for chunk, p in by_budget.items():
        assert p.prompt_decode_tokens_per_s <= plan.max_flow_tokens_per_s * (1 + 1e-6), chunk
        assert p.decode_tokens_per_s > 0.8 * by_budget[512].decode_tokens_per_s, chunk
    assert by_budget[256].decode_tokens_per_s >= 0.9 * by_budget[320].decode_tokens_per_s


def test_with_chunking_off_a_step_holds_no_more_decodes_than_the_unchunked_budget():
    """Chunking off (whole prompts), a worker step still holds at most
    :data:`helix.core.serving.UNCHUNKED_STEP_TOKENS` tokens of decodes (the step policy; only a step's
    first prompt may exceed it). With ``max_batch_seqs`` above it, T(k) and the prediction let a
    step hold 4,096 decodes (tiny-llama on an A100-80G: ~11,000 requests in flight, decode
    3.4 M tokens/s, 1.4x what 2,048-decode steps serve)."""
    spec = ClusterSpec.model_validate({
        "model": "tiny-llama", "dtype": "float16",
        "workload": {"mean_prompt_tokens": 64, "mean_output_tokens": 256},
        "serving": {"chunk_tokens": 0, "max_batch_seqs": 4096},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": "a", "gpu": "A100-80G"}]})
    plan = Plan(model="tiny-llama", num_layers=8, placements=(LayerSlice("a", 0, 8),),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "coordinator", 1.0)),
                max_flow_tokens_per_s=1.0)
    cost = CostModel.for_cluster(spec)
    assert cost.operating_point(spec.node("a"), 8).decode_seqs <= UNCHUNKED_STEP_TOKENS
    model = Model(spec, plan, cost)
    *_, batch, busy = model.solve(model.fill)
    assert batch.max() <= UNCHUNKED_STEP_TOKENS
    assert busy.max() <= 1.0 + 1e-6   # the node's steps fit in a second
