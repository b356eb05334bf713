"""The step budget chosen by the prediction (planner.budget, serving.chunk_tokens: auto)."""

from pathlib import Path

import pytest
import yaml

from helix.cli import main
from helix.core.plan import ArcFlow, Plan
from helix.core.serving import CHECKED_STEP_BUDGETS
from helix.core.slices import LayerSlice
from helix.core.spec import ClusterSpec
from planner import budget
from planner.build import serving_limits, with_serving
from planner.prediction import predict

REPO = Path(__file__).resolve().parents[2]


def spec_with(chunk_tokens) -> ClusterSpec:
    """Two L4s, each half of LLaMA-2 7B (a 2-stage pipeline)."""
    return ClusterSpec.model_validate({
        "model": "llama-2-7b", "dtype": "float16",
        "workload": {"mean_prompt_tokens": 763, "mean_output_tokens": 232},
        "serving": {"chunk_tokens": chunk_tokens},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": "a", "gpu": "L4"}, {"name": "b", "gpu": "L4"}]})


def two_stage(spec: ClusterSpec) -> Plan:
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "b", 1.0),
                           ArcFlow("b", "coordinator", 1.0)), max_flow_tokens_per_s=1.0)
    return with_serving(plan, spec)


def test_auto_writes_the_best_predicted_budget_into_the_plan():
    spec = spec_with("auto")
    assert spec.serving.choose_chunk_tokens and spec.serving.chunk_tokens == 256
    plan = budget.apply(spec, two_stage(spec))
    best = plan.extras["chunk_tokens_chosen"]
    assert plan.serving.chunk_tokens == best
    # Each candidate's figure is the prediction at that budget, and the chosen one is the best.
    for chunk in CHECKED_STEP_BUDGETS:
        at = budget.at_budget(spec, chunk)
        decode = predict(at, plan)[0].decode_tokens_per_s
        assert plan.extras["chunk_tokens_predicted"][str(chunk)] == pytest.approx(decode, abs=0.05)
    assert best == max(CHECKED_STEP_BUDGETS,
                       key=lambda c: (plan.extras["chunk_tokens_predicted"][str(c)], c))
    assert plan.prediction == predict(budget.at_budget(spec, best), plan)[0]
    # The simulator and helix serve run with the plan's budget (serving_limits reads it back).
    assert serving_limits(spec, plan).chunk_tokens == best
    # Deterministic.
    assert budget.apply(spec, two_stage(spec)) == plan


def test_the_budget_matters_to_the_prediction():
    spec = spec_with("auto")
    plan = two_stage(spec)
    best, by_budget = budget.choose(spec, plan)
    assert len({round(p.decode_tokens_per_s, 3) for p in by_budget.values()}) > 1
    assert budget.choose(spec, plan, candidates=(best,))[0] == best


@pytest.mark.parametrize("chunk", [512, 0])
def test_a_budget_the_user_set_is_kept(chunk):
    spec = spec_with(chunk)
    assert not spec.serving.choose_chunk_tokens
    plan = two_stage(spec)
    assert budget.apply(spec, plan) is plan
    assert plan.serving.chunk_tokens == chunk and serving_limits(spec, plan).chunk_tokens == chunk


def test_helix_plan_says_which_budget_and_why(tmp_path, capsys):
    data = yaml.safe_load((REPO / "cluster_specs" / "local3.yaml").read_text())
    data.setdefault("serving", {})["chunk_tokens"] = "auto"
    spec_path = tmp_path / "auto.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(spec_path), "-o", str(out), "--time-limit", "5"]) in (0, None)
    text = capsys.readouterr().out
    assert "step budget" in text and "chunk_tokens: auto" in text
    written = Plan.load(out)
    assert written.serving.chunk_tokens == written.extras["chunk_tokens_chosen"]
    for chunk in CHECKED_STEP_BUDGETS:
        assert f"{chunk}: " in text


@pytest.mark.parametrize("chunk, caution", [(None, False), (512, False), (2048, True), (0, True)])
def test_helix_plan_cautions_outside_the_checked_budgets(tmp_path, capsys, chunk, caution):
    """The prediction is checked against the simulator at 256 and 512 tokens a step only; a plan
    at another budget says so (and ``auto`` chooses among those two)."""
    data = yaml.safe_load((REPO / "cluster_specs" / "local3.yaml").read_text())
    if chunk is not None:
        data.setdefault("serving", {})["chunk_tokens"] = chunk
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    assert main(["plan", str(spec_path), "--time-limit", "5"]) in (0, None)
    text = " ".join(capsys.readouterr().out.split())
    assert ("caution" in text) == caution, text
    if caution:
        at = "with chunking off" if chunk == 0 else f"at a step budget of {chunk:,}"
        assert f"{at} this prediction is unchecked" in text
    assert CHECKED_STEP_BUDGETS == (256, 512)
