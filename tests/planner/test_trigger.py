"""When to re-plan: membership changes, workload drift past a band, the decision's
margin, a minimum interval; deterministic for a clock passed in."""

import pytest

from helix.core.slices import as_placement
from helix.core.spec import parse_cluster
from planner import PlanOptions, predicted
from planner.trigger import ReplanTrigger, TriggerConfig

THREE = {"l4-0", "l4-1", "l4-2"}


def _spec(count: int = 4):
    return parse_cluster({"model": "llama-2-7b",
                          "regions": {"east": {"bandwidth": "10Gbps", "latency": "1ms"}},
                          "nodes": [{"name": "l4-{i}", "gpu": "L4", "count": count, "region": "east"}]})


def _trigger(config: TriggerConfig = TriggerConfig(time_limit_s=3, window_s=60, min_requests=20,
                                                   min_interval_s=0)) -> ReplanTrigger:
    """Three of four L4s running the planner's placement for them; the fourth may join."""
    spec = _spec()
    probe = ReplanTrigger(spec, predicted.choose(spec, PlanOptions(method="separate")), config,
                          present=THREE)
    running = predicted.choose(probe.cluster(), PlanOptions(time_limit_s=3, threads=1))
    return ReplanTrigger(spec, running, config, present=THREE)


def _minute(trigger: ReplanTrigger, start_s: float, prompt: int, output: int, n: int = 30) -> None:
    for i in range(n):
        trigger.observe(start_s + i * 60.0 / n, prompt, output)


def _layers(plan) -> dict[str, tuple[int, int]]:
    return as_placement(plan.placements, skip_empty=True)


def test_alternating_small_mix_changes_cause_no_replan():
    t = _trigger()
    drifts = []
    for minute in range(8):
        prompt, output = (763, 232) if minute % 2 == 0 else (830, 215)
        _minute(t, minute * 60.0, prompt, output)
        assert t.poll(minute * 60.0 + 60.0) is None
        drifts.append(t.drift(t.observed_mix(minute * 60.0 + 60.0)))
    # The swings move capacities, but inside the 15 % band.
    assert 0.01 < max(drifts) < 0.15 and t.history == []
    # Without the band (drift 0), the same swings make every minute that differs from the last
    # decision's mix a re-plan to consider (the first is the spec's own mix: drift 0).
    loose = _trigger(TriggerConfig(time_limit_s=3, window_s=60, min_requests=20, min_interval_s=0,
                                   drift=0.0))
    for minute in range(4):
        prompt, output = (763, 232) if minute % 2 == 0 else (830, 215)
        _minute(loose, minute * 60.0, prompt, output)
        loose.poll(minute * 60.0 + 60.0)
    assert [r.at_s for r in loose.history] == [120.0, 180.0, 240.0]


def test_a_large_drift_triggers_exactly_one_replan():
    t = _trigger()
    _minute(t, 0.0, 763, 232)
    assert t.poll(60.0) is None
    for minute in range(1, 6):   # long outputs, short prompts from minute 1 on
        _minute(t, minute * 60.0, 200, 900)
        t.poll(minute * 60.0 + 60.0)
    assert len(t.history) == 1
    r = t.history[0]
    assert r.at_s == 120.0 and r.cause.startswith("drift") and r.drift > 0.15
    assert r.mix.mean_prompt_tokens == pytest.approx(200) and r.mix.mean_output_tokens == \
        pytest.approx(900)
    assert r.spec.workload == r.mix and t.mix == r.mix   # the new reference
    d = r.decision
    assert d.current_tokens_per_s > 0 and d.proposed_tokens_per_s >= d.current_tokens_per_s * 0.999


def test_a_join_replans_and_gives_the_node_layers():
    t = _trigger()
    before = _layers(t.plan)
    assert "l4-3" not in before and set(before) == THREE
    t.node_joined(30.0, "l4-3")
    r = t.poll(30.0)
    assert r is not None and r.cause == "join l4-3" and r.adopted
    assert "l4-3" in _layers(r.plan) and t.plan is r.plan
    d = r.decision
    assert d.proposed_tokens_per_s > 1.1 * d.current_tokens_per_s
    new = next(m for m in d.moves if m.node == "l4-3")
    assert new.old is None and new.beside and new.load_s == pytest.approx(new.load_bytes / 1.25e9)
    assert new.load_bytes >= (new.new[1] - new.new[0]) * r.spec.model.layer_bytes(2)
    assert t.poll(31.0) is None   # nothing new since


def test_a_node_that_leaves_loses_its_layers():
    t = _trigger()
    gone = next(iter(sorted(_layers(t.plan))))
    t.node_left(10.0, gone)
    r = t.poll(10.0)
    assert r.adopted and r.cause == f"leave {gone}" and r.decision.dropped_nodes == (gone,)
    assert gone not in _layers(r.plan) and sorted({n.name for n in r.spec.nodes}) == \
        sorted(THREE - {gone})


def test_min_interval_holds_back_a_second_drift_replan():
    t = _trigger(TriggerConfig(time_limit_s=3, window_s=60, min_requests=20, min_interval_s=600))
    _minute(t, 0.0, 200, 900)
    assert t.poll(60.0) is not None     # the first drift decision
    _minute(t, 60.0, 1800, 40)          # another large swing, 60 s later
    assert t.due(120.0) is None and t.poll(120.0) is None
    assert t.due(660.0) is None         # the window is empty by then: nothing to judge
    _minute(t, 600.0, 1800, 40)
    assert t.poll(660.0).cause.startswith("drift")


def test_the_trigger_is_deterministic():
    def run():
        t = _trigger()
        _minute(t, 0.0, 300, 700)
        t.node_joined(50.0, "l4-3")
        out = [t.poll(60.0)]
        _minute(t, 60.0, 1500, 100)
        out.append(t.poll(120.0))
        return [(r.summary(), sorted(_layers(r.plan).items())) for r in out if r is not None]
    first, second = run(), run()
    assert first == second and len(first) == 2


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="window_s must be > 0"):
        TriggerConfig(window_s=0)
    with pytest.raises(ValueError, match="drift must be >= 0"):
        TriggerConfig(drift=-0.1)
    with pytest.raises(ValueError, match="spec lacks"):
        ReplanTrigger(_spec(), predicted.choose(_spec(), PlanOptions(method="separate")),
                      present={"x"})


def test_extend_gives_only_the_idle_node_layers():
    from planner import max_flow
    from planner.build import build_problem
    from planner.trigger import extend
    t = _trigger()
    problem = build_problem(_spec())
    running = _layers(t.plan)
    out = extend(problem, running)
    assert {n: r for n, r in out.items() if n != "l4-3"} == running and "l4-3" in out
    start, end = out["l4-3"]
    node = problem.node("l4-3")
    assert end - start == node.max_layers_for(start == 0, end == problem.num_layers)
    assert max_flow(problem, out).value_tokens_per_s > 1.2 * max_flow(problem, running).value_tokens_per_s


def test_a_join_takes_the_extension_when_the_full_replan_moves_everyone_for_less():
    """The planner's proposal (here: a 4-node chain in reverse order with uneven stages, 10 / 10 /
    6 / 6 layers, every node moves) is weighed against the running placement with only the joined
    node given layers; the one with more net gain over the horizon is adopted. (An even 8-layer
    chain is predicted 2,652 tokens/s, above the extension, since steps hold at most the step
    budget; the simulator agrees it serves more: 665 vs 604 decode tokens/s, 600 s offline.)"""
    names = ["l4-3", "l4-2", "l4-1", "l4-0"]
    bounds = (0, 10, 20, 26, 32)
    chain = {n: (bounds[i], bounds[i + 1]) for i, n in enumerate(names)}
    t = _trigger()
    t.propose = lambda s, problem, running: predicted.evaluate(s, chain, problem=problem)
    t.node_joined(5.0, "l4-3")
    r = t.poll(5.0)
    assert r.adopted and r.proposal == "extend"
    assert [m.node for m in r.decision.moves] == ["l4-3"]
    full = predicted.evaluate(r.spec, chain).prediction.prompt_decode_tokens_per_s
    assert r.decision.proposed_tokens_per_s > full


def test_a_mix_the_running_placement_cannot_hold_is_judged_not_raised():
    """local3 (tiny model, KB-sized CPU nodes): under longer outputs a node keeps too little KV
    room for the layers it holds, so the planner refuses the running placement as it is (the
    trigger raised PlannerBug); it is judged without that node, and where no placement fits at all
    the running one is kept."""
    from helix.core.spec import load_cluster
    from tests.conftest import REPO_ROOT
    spec = load_cluster(REPO_ROOT / "cluster_specs" / "local3.yaml")
    running = predicted.choose(spec, PlanOptions(time_limit_s=2, threads=1))
    config = TriggerConfig(time_limit_s=2, window_s=60, min_requests=5, min_interval_s=0)
    results = {}
    for output in (64, 1024):
        t = ReplanTrigger(spec, running, config)
        for i in range(10):
            t.observe(float(i), 20, output)
        results[output] = t, t.poll(10.0)
    t, r = results[64]
    assert "too little KV room" in r.cause and r.drift > 0.15
    t, r = results[1024]
    assert not r.adopted and r.decision.current_tokens_per_s == 0 and t.plan is running
