"""The prediction under a small step budget: a wave of decodes bigger than the budget takes
several steps (the step policy cuts it), so the prediction must not starve the prompts."""

from __future__ import annotations

from pathlib import Path

from helix.prediction import predict
from helix.spec import load_cluster
from planner.budget import at_budget
from planner.build import build_problem
from planner.predicted import evaluate
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
