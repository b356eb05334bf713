"""The pipeline-aware prediction (planner.prediction): a hand-computed 2-stage pipeline, the pipeline
enumeration, the planner's outer loop (terminates, deterministic) and the prediction in plan files."""

import json
import math
from statistics import NormalDist
from pathlib import Path

import numpy as np
import pytest

from helix.cli import main
from helix.core.costmodel import CostModel
from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import ArcFlow, Plan
from helix.core.slices import LayerSlice
from helix.core.spec import ClusterSpec
from planner.prediction import DECODE_WAVES, PROMPT_CV, online_rates, predict
from planner.prediction.fallback import scheduler_fallback
from planner.prediction.model import Model, convoy_delay_s, prompt_piece_moments

REPO = Path(__file__).resolve().parents[2]
LOCAL3 = str(REPO / "cluster_specs" / "local3.yaml")


def two_stage_spec(chunk_tokens: int = 2048, slow_link: bool = False) -> ClusterSpec:
    """Two L4s, each half of LLaMA-2 7B; ``slow_link``: 100 Mb/s between them."""
    return ClusterSpec.model_validate({
        "model": "llama-2-7b", "dtype": "float16",
        "workload": {"mean_prompt_tokens": 400, "mean_output_tokens": 100},
        "serving": {"chunk_tokens": chunk_tokens},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        **({"links": [{"between": ["a", "b"], "bandwidth": "100Mbps", "latency": "1ms"}]}
           if slow_link else {}),
        "nodes": [{"name": "a", "gpu": "L4"}, {"name": "b", "gpu": "L4"}]})


def two_stage_plan() -> Plan:
    return Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "b", 1.0),
                           ArcFlow("b", "coordinator", 1.0)), max_flow_tokens_per_s=1.0)


@pytest.mark.parametrize("chunk_tokens, slow_link", [(2048, False), (256, False), (256, True)])
def test_two_stage_pipeline_by_hand(chunk_tokens, slow_link):
    """Offline: the KV of the tighter stage sets N; R, F and the batch D satisfy the fixed point
    written out here from the docstring's formulas. At 2048 a prompt runs whole; at 256 it takes
    p / (256 - D) pieces, the ones after the first paced by the slower stage, or by the link
    between the stages where a piece takes longer to cross it (100 Mb/s), and the two waves
    carry more tokens than 256-token steps hold, so the stages step more often than twice a round
    trip."""
    spec, plan = two_stage_spec(chunk_tokens, slow_link), two_stage_plan()
    cost = CostModel.for_cluster(spec)
    pred, (state,) = predict(spec, plan, cost)
    p, o = 400.0, 100.0
    a, b = spec.node("a"), spec.node("b")
    # KV: 0.9 x capacity / (p + o) requests on each stage; a holds the embedding, b the LM head.
    m = min(0.9 * cost.kv_capacity_tokens(a, 16, first=True) / 500,
            0.9 * cost.kv_capacity_tokens(b, 16, last=True) / 500)
    assert state.requests_in_flight == pytest.approx(m, rel=1e-6)
    # At the fixed point, steps/s of each stage: one per wave (W per round trip R), or more when
    # the waves carry more tokens (decodes and prompt pieces) than the step budget holds (so at
    # 256), but never more than back to back (1 / the mean step at D); D = decode tokens/s /
    # steps on both stages (same pipeline, same rate).
    rate = state.requests_per_s
    waves = max(DECODE_WAVES / state.round_trip_s, rate * (p + o) / chunk_tokens)
    assert (waves > DECODE_WAVES / state.round_trip_s) == (chunk_tokens == 256)

    def steps_at(d: float) -> float:
        t0, t1, sh = cost.stage_step_parts(a, 16, d)
        return min(waves, 1 / (t0 + sh * (t1 - t0)))
    D = 1.0
    for _ in range(200):   # D = decode tokens/s x (1 / steps at D): its fixed point
        D = rate * o / steps_at(D)
    steps = steps_at(D)
    parts = [cost.stage_step_parts(n, 16, D) for n in (a, b)]   # (plain, with a piece, share)
    # A token waits out the step in progress: a plain one (another wave) or a prompt piece's.
    plain_wait = [steps * (1 - sh) * t0 ** 2 / 2 for t0, _, sh in parts]
    piece_wait = [steps * sh * t1 ** 2 / 2 for _, t1, sh in parts]
    link = spec.link("coordinator", "a").latency_s * 3   # coordinator -> a -> b -> coordinator
    # Seconds per token on each hop: token ids to and from the coordinator, hidden states a -> b.
    per_token = [2 / spec.link("coordinator", "a").bandwidth_bytes_per_s,
                 4096 * 2 / spec.link("a", "b").bandwidth_bytes_per_s,
                 2 / spec.link("b", "coordinator").bandwidth_bytes_per_s]
    # Each link is a FIFO (M/G/1): a message waits u E[s^2] / (2 E[s] (1 - u)).
    link += sum((u := min(0.95, rate * (p + o) * s)) * (p / (p + o) * p * s / 2 + o / (p + o) * D * s / 2)
                / (1 - u) for s in per_token)
    # The prompt's lag behind a decode wave: its longer step at each stage, and its pieces after
    # the first at the slower stage's pace.
    pieces = p / min(p, chunk_tokens - D)
    assert (pieces > 1) == (chunk_tokens == 256)
    stages_pace = (pieces - 1) * max(t1 for _, t1, _ in parts)
    # The prompt's step is longer than the step a decode rides (a plain one: no other pipeline
    # sends prompts here) by t1 - t0.
    lag = sum(t1 - t0 for t0, t1, _ in parts)
    # Convoy: a wave entering a ~ Exp(rate) after the pipeline's latest prompt exits
    # max(0, excess - a) late: E = excess - (1 - exp(-rate excess)) / rate, with the excess
    # taken over the prompts' lengths L (lognormal, mean p, CV PROMPT_CV, at most the context):
    # the prompt's longer steps grow with its first piece, min(L, room), its pacing with the
    # pieces after the first. One stream with the first two moments of rate x excess (S1, S2):
    # rate S1^2 / S2, excess S2 / S1, so E = S2 / S1 x (1 - (1 - exp(-S1)) / S1).
    room = chunk_tokens - D
    sigma = math.sqrt(math.log(1 + PROMPT_CV ** 2))
    z = np.array([NormalDist().inv_cdf((k + 0.5) / 20_000) for k in range(20_000)])
    lengths = np.minimum(p * np.exp(sigma * z - sigma ** 2 / 2), 4096)
    excess = lag * np.minimum(lengths, room) / min(p, room)
    if pieces > 1:
        excess = excess + stages_pace * np.maximum(lengths / room - 1, 0) / (pieces - 1)
    s1, s2 = rate * excess.mean(), rate * (excess ** 2).mean()
    convoy = s2 / s1 * (1 - (1 - math.exp(-s1)) / s1)
    # A decode rides its wave's step, N / W decodes (at least D, at most what a step holds), not
    # the mean step: at 256 the budget's extra steps carry prompt pieces and few decodes.
    ride = min(max(m / DECODE_WAVES, D), cost.serving.max_batch_seqs, chunk_tokens)
    # (Without the budget's steps, D is N / W less the requests still in their prompts.)
    assert ride > 1.05 * D if chunk_tokens == 256 else ride == pytest.approx(D, rel=0.02)
    rides = [cost.stage_step_parts(n, 16, ride)[0] for n in (a, b)]
    R = sum(t + w for t, w in zip(rides, plain_wait)) + link + D * sum(per_token) + convoy
    assert state.round_trip_s == pytest.approx(R, rel=0.01)
    # The first token: the first piece's steps and bytes everywhere; the pieces after it paced
    # by the slower stage or by the slowest link (a piece's bytes over it).
    links_pace = (pieces - 1) * p / pieces * max(per_token)
    assert (links_pace > stages_pace) == slow_link
    F = sum(t0 + w0 + w1 for (t0, _, _), w0, w1 in zip(parts, plain_wait, piece_wait)) + link \
        + sum(t1 - t0 for t0, t1, _ in parts) + max(stages_pace, links_pace) \
        + p / pieces * sum(per_token)
    assert state.first_token_s == pytest.approx(F, rel=0.01)
    # Little's law.
    assert rate == pytest.approx(m / (F + (o - 1) * R), rel=0.02)
    assert pred.decode_tokens_per_s == pytest.approx(rate * o, rel=1e-9)
    assert pred.prompt_decode_tokens_per_s == pytest.approx(rate * (p + o), rel=1e-9)
    # The old T(k) says each node serves far more: it batches every KV-resident request each step.
    assert cost.throughput_tokens_per_s(a, 16) > pred.prompt_decode_tokens_per_s
    # Online at 75 %: latencies exist, and a token's time is at least the two decode steps.
    assert pred.tpot_p50_s >= sum(cost.stage_step_s(n, 16, 1) for n in (a, b))
    assert pred.ttft_p50_s > pred.tpot_p50_s


def test_convoy_delay_against_a_poisson_sample():
    """The convoy's closed form against a sample: prompts Poisson at lambda, a wave entering at a
    random time exits max(0, Delta - (time since the latest prompt)) late; and its two limits."""
    rng = np.random.default_rng(7)
    for lam, delta in [(0.2, 3.0), (1.0, 1.0), (5.0, 2.0)]:
        arrivals = np.cumsum(rng.exponential(1 / lam, 400_000))
        t = rng.uniform(arrivals[10], arrivals[-10], 200_000)
        age = t - arrivals[np.searchsorted(arrivals, t) - 1]
        sampled = np.maximum(0.0, delta - age).mean()
        assert convoy_delay_s(np.array([delta]), np.array([lam]))[0] == pytest.approx(sampled, rel=0.02)
    # Rare prompts: lambda Delta^2 / 2 (the residual of one long stretch); overlapping ones:
    # Delta - 1 / lambda (the wave is always behind a prompt); none: 0.
    assert convoy_delay_s(np.array([2.0]), np.array([1e-4]))[0] == pytest.approx(1e-4 * 2.0, rel=1e-3)
    assert convoy_delay_s(np.array([2.0]), np.array([100.0]))[0] == pytest.approx(2.0 - 0.01, rel=1e-6)
    assert convoy_delay_s(np.array([2.0, 0.0]), np.array([0.0, 1.0])).tolist() == [0.0, 0.0]


def test_overlapping_convoys_against_a_poisson_sample():
    """Several prompt streams at once (rate lambda_j, excess Delta_j): a wave is held by the
    latest prompt of each, max over j of max(0, Delta_j - a_j), not the sum of the streams'
    delays (that overcounts overlapping convoys by up to 60 % here). One stream with the same
    first two moments of lambda x Delta, as ``Model.convoys_s`` takes them, is within 10 %."""
    rng = np.random.default_rng(3)
    for streams in ([(0.2, 1.0), (0.3, 0.5), (0.1, 2.0)], [(1.0, 0.6)] * 4, [(0.05, 0.3)] * 20,
                    [(2.0, 0.2), (0.2, 1.5)]):
        horizon = 200_000 / sum(lam for lam, _ in streams)
        t = rng.uniform(2_000, horizon - 2_000, 100_000)
        delay = np.zeros_like(t)
        for lam, delta in streams:
            arrivals = np.cumsum(rng.exponential(1 / lam, int(lam * horizon * 1.1) + 100))
            age = t - arrivals[np.searchsorted(arrivals, t) - 1]
            delay = np.maximum(delay, np.maximum(0.0, delta - age))
        s1 = sum(lam * delta for lam, delta in streams)
        s2 = sum(lam * delta ** 2 for lam, delta in streams)
        matched = convoy_delay_s(np.array([s2 / s1]), np.array([s1 ** 2 / s2]))[0]
        assert matched == pytest.approx(delay.mean(), rel=0.10)


def test_prompt_piece_moments_over_lognormal_lengths():
    """Whole prompts: the first piece is the prompt, E[f] = 1 and E[f^2] = 1 + CV^2 (to the
    quadrature's 1 %); a room well below the mean prompt cuts nearly every prompt's first piece
    to the room (f <= 1) and its later pieces carry the rest (E[g] ~ 1: few prompts are shorter
    than a piece)."""
    f1, f2, g1, g2, _ = prompt_piece_moments(763.0, math.inf, 1e9)
    assert (f1, f2, g1, g2) == (pytest.approx(1.0), pytest.approx(1 + PROMPT_CV ** 2, rel=0.02), 0, 0)
    f1, f2, g1, _, _ = prompt_piece_moments(763.0, 200.0, 1e9)
    assert f1 < 1 and f2 < 1 and g1 == pytest.approx(1.0, rel=0.05)


def test_other_pipelines_prompts_lead_convoys_along_shared_nodes():
    """Two pipelines through a shared first stage and separate second stages: each one's decodes
    are held by its own prompts along all its nodes and by the other's along the node they
    share."""
    spec = ClusterSpec.model_validate({
        "model": "llama-2-7b", "dtype": "float16",
        "workload": {"mean_prompt_tokens": 400, "mean_output_tokens": 100},
        "serving": {"chunk_tokens": 2048},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": n, "gpu": "L4"} for n in ("a", "b", "c")]})
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32), LayerSlice("c", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 2.0), ArcFlow("a", "b", 1.0),
                           ArcFlow("a", "c", 1.0), ArcFlow("b", "coordinator", 1.0),
                           ArcFlow("c", "coordinator", 1.0)), max_flow_tokens_per_s=2.0)
    m = Model(spec, plan, CostModel.for_cluster(spec))
    assert len(m.paths) == 2
    # A prompt's excess per (path, node) entry: 0.2 s at a, 0.3 s at b and c.
    by_node = {"a": 0.2, "b": 0.3, "c": 0.3}
    excess = np.array([by_node[m.nodes[j]] for j in m.incidence.cols])
    f1, f2 = prompt_piece_moments(400.0, 2048.0, m.max_prompt)[:2]
    # Only the first pipeline sends prompts: the second's decodes follow them over a (0.2 s).
    one = m.convoys_s(excess, np.zeros(2), np.array([1.0, 0.0]), 2048.0)
    for delay, delta in zip(one, (0.5, 0.2)):
        s1, s2 = delta * f1, delta ** 2 * f2
        assert delay == pytest.approx(convoy_delay_s(np.array([s2 / s1]), np.array([s1 ** 2 / s2]))[0])
    # Where the shared node adds nothing to a prompt's steps, the other's prompts hold nobody.
    none_at_a = np.where(m.incidence.cols == m.nodes.index("a"), 0.0, excess)
    assert m.convoys_s(none_at_a, np.zeros(2), np.array([1.0, 0.0]), 2048.0)[1] == 0
    # Rare prompts: each stream's lambda Delta^2 / 2, Delta over the nodes both use (a only for
    # the other's), times E[f^2] of the first piece over the prompts' lengths.
    rare = m.convoys_s(excess, np.zeros(2), np.array([1e-4, 1e-4]), 2048.0)
    assert rare[0] == pytest.approx(1e-4 * f2 * ((0.2 + 0.3) ** 2 + 0.2 ** 2) / 2, rel=1e-3)


def test_fallback_paths_fill_what_the_flow_paths_leave():
    """Flow only through a; b holds the whole model too. The scheduler sends requests to b when
    a's KV is full (its fallback to any usable hop), so b's KV counts as well."""
    spec = two_stage_spec()
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 32), LayerSlice("b", 0, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "coordinator", 1.0)),
                max_flow_tokens_per_s=1.0)
    cost = CostModel.for_cluster(spec)
    pred, states = predict(spec, plan, cost)
    assert [s.pipeline.nodes for s in states] == [("a",), ("b",)]
    assert [s.pipeline.share for s in states] == [1.0, 0.0]
    kv = [0.9 * cost.kv_capacity_tokens(spec.node(n), 32, first=True, last=True) / 500
          for n in ("a", "b")]
    assert [s.requests_in_flight for s in states] == pytest.approx(kv, rel=1e-6)
    assert pred.pipelines == 2
    assert pred.requests_per_s == pytest.approx(sum(s.requests_per_s for s in states))


def test_pipeline_shares_follow_the_flow_splits():
    plan = Plan(model="m", num_layers=4,
                placements=(LayerSlice("x", 0, 2), LayerSlice("y", 2, 4),
                            LayerSlice("z", 1, 4)),
                arc_flows=(ArcFlow("coordinator", "x", 4.0), ArcFlow("x", "y", 3.0),
                           ArcFlow("x", "z", 1.0), ArcFlow("y", "coordinator", 3.0),
                           ArcFlow("z", "coordinator", 1.0)), max_flow_tokens_per_s=4.0)
    paths = enumerate_pipelines(plan)
    assert [(p.nodes, round(p.share, 6)) for p in paths] == [(("x", "y"), 0.75), (("x", "z"), 0.25)]
    # Partial inference: z starts inside its range, where x stopped.
    assert paths[1].stages[1].start == 2 and paths[1].stages[1].end == 4


def test_outer_loop_terminates_and_is_deterministic():
    from helix.core.spec import load_cluster
    from planner.options import ITERATIONS, PlanOptions
    from planner.predicted import choose
    spec = load_cluster(LOCAL3)
    options = PlanOptions(time_limit_s=6, threads=1, iterations=3)
    first, again = choose(spec, options), choose(spec, options)
    assert 1 <= len(first.extras["predicted_by_round"]) <= 3
    assert ITERATIONS >= 1
    assert first.placements == again.placements
    assert first.prediction == again.prediction
    assert first.prediction.prompt_decode_tokens_per_s == max(first.extras["predicted_by_round"]) \
        or first.prediction.prompt_decode_tokens_per_s == pytest.approx(
            max(first.extras["predicted_by_round"]), abs=0.1)


def test_prediction_in_plan_json_and_yaml(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["plan", LOCAL3, "-o", str(out), "--json", "--threads", "1",
                 "--time-limit", "6"]) == 0
    data = json.loads(capsys.readouterr().out)
    pred = data["prediction"]
    assert pred["prompt_decode_tokens_per_s"] > 0 and pred["decode_tokens_per_s"] > 0
    assert pred["ttft_p50_s"] > 0 and pred["tpot_p50_s"] > 0 and pred["online_load"] == 0.75
    assert Plan.load(out).prediction.prompt_decode_tokens_per_s == \
        pytest.approx(pred["prompt_decode_tokens_per_s"])


def test_kind_chain_routing_keeps_pipelines_within_a_kind():
    """single24: the max flow of the 'separate' placement sends A100 tokens through L4s; the
    kind-chain routing does not, and the prediction prefers it (an A100 chain is ~5x faster).
    The margin was > 1.3x before decode attention paid for GQA's KV re-reads; the A100 stages,
    which batch the most decodes, now step slower at those batches, so it is ~1.17x."""
    from helix.core.spec import load_cluster
    from planner.build import build_problem
    from planner.options import PlanOptions
    from planner.predicted import choose, routings
    from planner.solve import solve
    spec = load_cluster(REPO / "cluster_specs" / "single24.yaml")
    problem = build_problem(spec)
    found = solve(problem, "separate")
    kind = {n.name: n.gpu for n in problem.nodes}
    crossing = [a for a in found.arc_flows if a.flow_tokens_per_s > 0 and "coordinator" not in
                (a.src, a.dst) and kind[a.src] != kind[a.dst]]
    assert crossing   # the solver's flows mix kinds
    candidates = routings(problem, found)
    chains = [c for c in candidates if c.extras.get("routing") == "kind chains"]
    assert len(chains) == 1
    assert all(kind[a.src] == kind[a.dst] for a in chains[0].arc_flows
               if "coordinator" not in (a.src, a.dst))
    assert chains[0].extras["routed_tokens_per_s"] <= found.max_flow_tokens_per_s * (1 + 1e-9)
    best = choose(spec, PlanOptions(method="separate"))
    assert best.extras["routing"] == "kind chains"
    assert best.prediction.decode_tokens_per_s > predict(spec, found)[0].decode_tokens_per_s * 1.1


def test_a_slow_link_queues_prompts_ahead_of_decodes():
    """Links are FIFOs: on a 100 Mb/s hop a prompt's hidden states take seconds, and decode
    messages wait behind them; the round trip grows by more than the bytes of its own tokens."""
    fast = two_stage_spec()
    slow = ClusterSpec.model_validate({**fast.model_dump(by_alias=True, exclude_none=True),
                                       "links": [{"between": ["a", "b"], "bandwidth": "100Mbps",
                                                  "latency": "1ms"}]})
    _, (f,) = predict(fast, two_stage_plan())
    _, (s,) = predict(slow, two_stage_plan())
    hidden_s = 4096 * 2 / (100e6 / 8)   # one decode token's hidden state over the slow link
    assert s.round_trip_s > f.round_trip_s + 10 * hidden_s
    assert s.first_token_s > f.first_token_s + 400 * hidden_s   # the 400-token prompt's transfer


def test_a_link_with_every_kth_prompt_of_its_boundary_waits_less():
    """Two second stages behind one first stage, each over a 100 Mb/s link: the scheduler deals
    the boundary's prompts to the two links in turn, so each gets every other one (Erlang-2
    intervals, c_a^2 = 1/2) and waits (c_a^2 + c_s^2) / (1 + c_s^2) of the M/G/1 wait
    (Allen-Cunneen); the coordinator's hop into the first stage carries every prompt (c_a^2 = 1:
    M/G/1 as before)."""
    spec = ClusterSpec.model_validate({
        "model": "llama-2-7b", "dtype": "float16",
        "workload": {"mean_prompt_tokens": 400, "mean_output_tokens": 100},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "links": [{"between": ["a", x], "bandwidth": "100Mbps", "latency": "1ms"} for x in "bc"],
        "nodes": [{"name": n, "gpu": "L4"} for n in "abc"]})
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32),
                            LayerSlice("c", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "b", 0.5),
                           ArcFlow("a", "c", 0.5), ArcFlow("b", "coordinator", 0.5),
                           ArcFlow("c", "coordinator", 0.5)), max_flow_tokens_per_s=1.0)
    model = Model(spec, plan, CostModel.for_cluster(spec))
    assert len(model.paths) == 2
    p, o, batch, rate = 400.0, 100.0, 4.0, np.array([0.3, 0.3])

    def mg1(requests_per_s: float, token_s: float) -> float:
        u = min(0.95, requests_per_s * (p + o) * token_s)
        return u * (p / (p + o) * p * token_s / 2 + o / (p + o) * batch * token_s / 2) / (1 - u)

    ids = 2 / spec.link("coordinator", "a").bandwidth_bytes_per_s
    hidden = 4096 * 2 / (100e6 / 8)
    back = 2 / spec.link("b", "coordinator").bandwidth_bytes_per_s
    half = (0.5 + PROMPT_CV ** 2) / (1 + PROMPT_CV ** 2)
    want = mg1(0.6, ids) + half * mg1(0.3, hidden) + half * mg1(0.3, back)
    assert model.link_waits(rate, batch) == pytest.approx([want, want], rel=1e-9)
    assert half * mg1(0.3, hidden) < 0.7 * mg1(0.3, hidden)


def test_sparse_incidence_matches_dense_numpy():
    """planner.prediction.incidence.Incidence (paths x nodes as nonzero entries) computes what the dense arrays
    did: products both ways, column scaling, columns touched by a row mask, row maxima."""
    import numpy as np

    from planner.prediction.incidence import Incidence
    rng = np.random.default_rng(3)
    for shape in ((1, 1), (7, 4), (40, 25)):
        dense = (rng.random(shape) < 0.3).astype(float)
        m = Incidence.of({(int(i), int(j)) for i, j in zip(*np.nonzero(dense))}, shape)
        x, y, v = rng.random(shape[1]), rng.random(shape[0]), rng.random(shape[0])
        assert np.allclose(m @ x, dense @ x) and np.allclose(m.T @ y, dense.T @ y)
        scaled = m.T.scale_columns(v)
        assert np.allclose(scaled @ y, (dense.T * v) @ y)
        mask = rng.random(shape[1]) < 0.5
        assert np.array_equal(m.T.columns_in(mask), dense.T[mask].sum(axis=0) > 0)
        assert np.allclose(m.row_max(x), np.max(dense * x, axis=1))


def test_scheduler_fallback_plays_the_rule_in_bulk():
    """Flow path a -> b fills until b's KV is full (10 requests); then the scheduler's fallback
    sends requests over a's other usable hops, each to the least used (by fraction) of c and d
    (both [16, 32)), until a is full: a's 60 left split so that c and d are equally used,
    x / 50 = (60 - x) / 20, x = 42.9 (to within a request: the rule moves a bulk at a time)."""
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32),
                            LayerSlice("c", 16, 32), LayerSlice("d", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "b", 1.0),
                           ArcFlow("b", "coordinator", 1.0)), max_flow_tokens_per_s=1.0)
    flow_paths = enumerate_pipelines(plan)
    assert [q.nodes for q in flow_paths] == [("a", "b")]
    found = scheduler_fallback(plan, flow_paths, {"a": 70.0, "b": 10.0, "c": 50.0, "d": 20.0})
    taken = {q.nodes: n for q, n in found}
    assert set(taken) == {("a", "c"), ("a", "d")}
    assert taken[("a", "c")] == pytest.approx(60 * 50 / 70, abs=1.0)
    assert taken[("a", "d")] == pytest.approx(60 * 20 / 70, abs=1.0)
    assert 59.0 <= sum(taken.values()) <= 60.0 + 1e-9
    assert found == scheduler_fallback(plan, flow_paths, {"a": 70.0, "b": 10.0, "c": 50.0, "d": 20.0})


def test_online_load_goes_to_the_flow_paths_first():
    """Online the scheduler takes the max-flow paths while they have room: at 75 % of a total of
    6 requests/s the flow paths (3 of it at saturation) run full and the fallback path takes the
    other 1.5; at 25 % the flow paths take it all, each in proportion to its saturated rate."""
    saturated, primary = np.array([2.0, 1.0, 3.0]), np.array([True, True, False])
    assert online_rates(saturated, primary, 0.75).tolist() == pytest.approx([2.0, 1.0, 1.5])
    assert online_rates(saturated, primary, 0.25).tolist() == pytest.approx([1.0, 0.5, 0.0])
