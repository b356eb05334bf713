"""KV stages (``planner.search.kv_stages``): one copy of the weights as a chain of one-kind stages,
split to hold the most requests in flight; a candidate the prediction scores (planner.predicted)."""

from __future__ import annotations

import itertools

import pytest

from helix.core.costmodel import CostModel
from helix.core.spec import ClusterSpec, load_cluster
from planner.build import build_problem
from planner.predicted import (best_candidate, evaluate,
                               evaluate_placement, kv_stage_candidates)
from planner.prediction import NoFixedPoint, predict
from planner.prediction import fixed_point
from planner.search import kv_stages
from planner.search.kv_stages import MAX_STAGES, kv_stage_placements
from tests.conftest import CLUSTER_SPECS

#: The capped-KV re-solve's placement that ``helix plan`` chose on single24 before (60 s, 512-token
#: budget): the four A100s hold 46 layers as one chain and bound the requests in flight.
CAPPED_SINGLE24 = {"a100-0": (0, 10), "a100-1": (10, 22), "a100-2": (22, 34), "a100-3": (34, 46),
                   **{f"l4-{i}": (46, 53) for i in range(3)},
                   **{f"l4-{i}": (53, 60) for i in range(3, 6)},
                   "l4-6": (60, 62), "l4-7": (62, 64),
                   **{f"t4-{i}": (64 + 4 * (i // 3), 68 + 4 * (i // 3)) for i in range(12)}}


def _single24() -> tuple[ClusterSpec, CostModel]:
    spec = load_cluster(CLUSTER_SPECS / "single24.yaml")
    return spec, CostModel.for_cluster(spec)


def _stages(placement: dict[str, tuple[int, int]]) -> list[tuple[tuple[int, int], list[str]]]:
    by_range: dict[tuple[int, int], list[str]] = {}
    for node, r in placement.items():
        by_range.setdefault(r, []).append(node)
    return sorted(by_range.items())


def test_candidates_are_one_copy_chains_of_one_kind_stages():
    spec, cost = _single24()
    found = kv_stage_placements(spec, cost, 80)
    assert found and len({name for name, _ in found}) == len(found)
    for name, placement in found:
        assert set(placement) == {n.name for n in spec.nodes}, name
        stages = _stages(placement)
        assert len(stages) <= MAX_STAGES
        at = 0
        for (start, end), nodes in stages:   # contiguous, no overlap: one copy of the weights
            assert start == at and end > start, name
            at = end
            assert len({spec.node(n).gpu for n in nodes}) == 1, name
            for n in nodes:
                assert end - start <= cost.max_layers(spec.node(n), first=start == 0,
                                                      last=end == 80), (name, n)
        assert at == 80, name
        # Kinds in order of memory: A100s first, then L4s, then T4s.
        kinds = [spec.node(nodes[0]).gpu for _, nodes in stages]
        assert kinds == sorted(kinds, key=["A100-40G", "L4", "T4"].index), name
    assert ("kv stages: 4x1 A100-40G x 8, 4x2 L4 x 7, 4x3 T4 x 5",
            {**{f"a100-{i}": (8 * i, 8 * i + 8) for i in range(4)},
             **{f"l4-{i}": (32 + 7 * (i // 2), 39 + 7 * (i // 2)) for i in range(8)},
             **{f"t4-{i}": (60 + 5 * (i // 3), 65 + 5 * (i // 3)) for i in range(12)}}) in found


def _held(spec, cost, placement) -> float:
    """Tokens per layer the chain holds: the least over stages of width x a node's KV room."""
    return min(len(nodes) * cost.kv_capacity_tokens(spec.node(nodes[0]), end - start)
               for (start, end), nodes in _stages(placement))


def test_each_choice_keeps_the_splits_that_hold_the_most_by_brute_force():
    """Small cluster (4 A100 + 3 T4, LLaMA-2 70B): every split of 80 layers over every choice of
    stage counts, enumerated directly; the kept ones hold the most (per choice)."""
    spec = ClusterSpec.model_validate({
        "model": "llama-2-70b", "dtype": "float16",
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": "a-{i}", "gpu": "A100-40G", "count": 4},
                  {"name": "t-{i}", "gpu": "T4", "count": 3}]})
    cost = CostModel.for_cluster(spec)
    found = kv_stage_placements(spec, cost, 80)
    assert found
    a_most = min(cost.max_layers(spec.node("a-0"), first=f) for f in (False, True))
    t_most = min(cost.max_layers(spec.node("t-0"), last=la) for la in (False, True))
    for sa, st in itertools.product((1, 2, 4), (1, 3)):
        best = 0.0
        for la in range(1, a_most + 1):
            rest = 80 - sa * la
            if rest > 0 and rest % st == 0 and rest // st <= t_most:
                best = max(best, min(4 // sa * cost.kv_capacity_tokens(spec.node("a-0"), la),
                                     3 // st * cost.kv_capacity_tokens(spec.node("t-0"),
                                                                       rest // st)))
        mine = [p for name, p in found if name.startswith(f"kv stages: {sa}x{4 // sa} ")
                and f", {st}x{3 // st} T4" in name]
        assert bool(mine) == (best > 0)
        if mine:
            assert _held(spec, cost, mine[0]) == best


def test_multi_region_and_many_kind_clusters_get_none():
    for name in ("geo24", "hetero42"):   # regions; 6,912 choices of stage counts
        spec = load_cluster(CLUSTER_SPECS / f"{name}.yaml")
        assert kv_stage_placements(spec, CostModel.for_cluster(spec), 80) == []


def test_too_many_choices_get_none(monkeypatch):
    spec, cost = _single24()   # 3 x 4 x 6 = 72 choices
    monkeypatch.setattr(kv_stages, "MAX_CHOICES", 71)
    assert kv_stage_placements(spec, cost, 80) == []


def test_the_prediction_picks_a_kv_chain_on_single24():
    """Against the capped-KV plan chosen before, the prediction picks the 8 / 7 / 5 chain (A100s
    8 layers each, L4 pairs 7, T4 triples 5: KV for ~570 requests where the A100s held ~280).
    The simulator agrees once the KV has filled (BENCHMARKS.md, Helix vs Swarm: 300 s offline
    runs, 559 vs 483 decode tokens/s; the first ~150 s fill the larger KV and are even)."""
    spec, cost = _single24()
    problem = build_problem(spec)
    before = evaluate(spec, CAPPED_SINGLE24, problem=problem)
    chosen = best_candidate(spec, problem, cost, before, kv_stage_placements(spec, cost, 80))
    assert chosen.extras["chosen_by"] == "prediction: kv stages: 4x1 A100-40G x 8, 4x2 L4 x 7, " \
                                         "4x3 T4 x 5"
    assert chosen.prediction.requests_in_flight > 1.8 * before.prediction.requests_in_flight


def test_region_partitions_are_every_ordered_set_partition():
    """Brute force: every assignment of regions to labelled blocks, each block in every order,
    the same set of chain lists (ordered set partitions: 1, 3, 13, 73 for 1-4 regions)."""
    for n, count in ((1, 1), (2, 3), (3, 13), (4, 73)):
        regions = [f"r{i}" for i in range(n)]
        found = kv_stages.region_partitions(regions)
        assert len(found) == count
        brute = set()
        for labels in itertools.product(range(n), repeat=n):
            blocks = [tuple(r for r, b in zip(regions, labels) if b == k) for k in range(n)]
            for orders in itertools.product(*(itertools.permutations(b) for b in blocks if b)):
                brute.add(frozenset(orders))
        assert {frozenset(p) for p in found} == brute
    assert kv_stages.region_partitions([f"r{i}" for i in range(kv_stages.MAX_REGIONS + 1)]) == []


def test_a_chain_over_two_regions_crosses_once():
    spec = load_cluster(CLUSTER_SPECS / "geo24.yaml")
    cost = CostModel.for_cluster(spec)
    found = kv_stages.chain_placements(spec, cost, 80, ("eu-west", "us-west"))
    assert found
    for name, placement in found:
        assert {spec.region_of(n) for n in placement} == {"eu-west", "us-west"}
        stages = _stages(placement)
        regions = [spec.region_of(nodes[0]) for _, nodes in stages]
        assert regions == sorted(regions, key=["eu-west", "us-west"].index), name   # one crossing
        assert stages[-1][0][1] == 80 and len(stages) <= MAX_STAGES


@pytest.mark.slow   # ~15 s on a quiet core: the best-holding chains of every region order predicted
def test_the_prediction_picks_one_chain_through_all_three_regions_on_geo24(caplog):
    """geo24 at a 256-token step budget: against its max-flow placement (one chain per region,
    ~160 requests in flight), the prediction picks one chain through all three regions, the
    US-East A100s first, then the US-West T4s (4 node pairs at the slow link, not the 2 L4s' 2),
    ~570 requests in flight (600 s offline: 457 predicted, 477-480 simulated decode tokens/s,
    against 442 for the best chain over two regions beside the A100s alone)."""
    spec = load_cluster(CLUSTER_SPECS / "geo24.yaml")
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"chunk_tokens": 256})})
    cost, problem = CostModel.for_cluster(spec), build_problem(spec)
    regional = {**{f"east-a100-{i}": (20 * i, 20 * i + 20) for i in range(4)},
                **{f"eu-l4-{i}": (10 * i, 10 * i + 10) for i in range(6)},
                **{f"eu-t4-{i}": (60 + 5 * i, 65 + 5 * i) for i in range(4)},
                **{f"west-l4-{i}": (8 * i, 8 * i + 8) for i in range(2)},
                **{f"west-t4-{i}": (16 + 8 * i, 24 + 8 * i) for i in range(8)}}
    before = evaluate(spec, regional, problem=problem)
    with caplog.at_level("WARNING", logger="helix.planner.prediction"):
        candidates = kv_stage_candidates(spec, problem, cost, before)
    assert "no fixed point" not in caplog.text   # such chains are dropped, not warned about
    assert len(candidates) <= len(kv_stages.region_partitions(["eu-west", "us-east", "us-west"]))
    chosen = best_candidate(spec, problem, cost, before, candidates, routed=True)
    name = chosen.extras["chosen_by"]
    assert name.startswith("prediction: kv stages: 4x1 A100-40G (us-east) x 8, 2x4 T4 (us-west)"), name
    assert " | " not in name, name
    assert chosen.prediction.requests_in_flight > 3 * before.prediction.requests_in_flight


def test_chains_over_regions_try_each_regions_kinds_both_ways_round():
    """A chain over several regions meets the next region with either of its kinds; one region
    keeps its kinds by memory (most first)."""
    spec = load_cluster(CLUSTER_SPECS / "geo24.yaml")
    cost = CostModel.for_cluster(spec)
    orders = set()
    for _, placement in kv_stages.chain_placements(spec, cost, 80, ("us-west", "eu-west")):
        kinds = [(spec.region_of(nodes[0]), spec.node(nodes[0]).gpu) for _, nodes in _stages(placement)]
        orders.add(tuple(dict.fromkeys(kinds)))
    assert orders == {(("us-west", a), ("us-west", b), ("eu-west", c), ("eu-west", d))
                      for a, b in (("L4", "T4"), ("T4", "L4")) for c, d in (("L4", "T4"), ("T4", "L4"))}
    s24, c24 = _single24()
    for _, placement in kv_stage_placements(s24, c24, 80):
        kinds = dict.fromkeys(s24.node(nodes[0]).gpu for _, nodes in _stages(placement))
        assert list(kinds) == ["A100-40G", "L4", "T4"]


def _splits_by_brute_force(kinds, stages, most, cost, num_layers):
    found = []
    for layers in itertools.product(*(range(1, m + 1) for m in most)):
        if sum(s * l for s, l in zip(stages, layers)) != num_layers:
            continue
        held = min(len(g) // s * cost.kv_capacity_tokens(g[0], l)
                   for g, s, l in zip(kinds, stages, layers))
        if held > 0:
            found.append((held, layers))
    found.sort(key=lambda t: -t[0])
    return found[:kv_stages.PER_CHOICE]


def test_the_pruned_split_search_equals_trying_every_split():
    """Every choice of stage counts of a 3-kind chain over two of geo24's regions (both kind
    orders) and of single24: the depth-first search with pruning keeps the same splits, ties in
    the same (lexicographic) order, as enumerating every split."""
    spec = load_cluster(CLUSTER_SPECS / "geo24.yaml")
    cost = CostModel.for_cluster(spec)
    cases = [(spec, cost, order) for order in kv_stages._kind_orders(spec, ("us-east", "us-west"))]
    s24, c24 = _single24()
    cases.append((s24, c24, kv_stages._kinds(list(s24.nodes))))
    checked = 0
    for sp, c, kinds in cases:
        most = [min(c.max_layers(g[0], first=f, last=la) for f in (False, True)
                    for la in (False, True)) for g in kinds]
        for stages in itertools.product(*(kv_stages._divisors(len(g)) for g in kinds)):
            assert kv_stages._splits(kinds, stages, most, c, 80) == \
                _splits_by_brute_force(kinds, stages, most, c, 80), stages
            checked += 1
    assert checked >= 72


def test_a_chain_whose_prediction_finds_no_fixed_point_is_said_or_refused(caplog, monkeypatch):
    """geo24, a chain through all three regions whose slow crossing from the US-East A100s goes
    through one node pair (into the EU T4s one by one), with the iterations allowed cut to two so
    that the fixed point is not reached (the prediction now reaches it on this chain within the
    usual limit). predict() warns; strict, it raises, and the KV stage scoring drops the chain
    instead of warning."""
    monkeypatch.setattr(fixed_point, "MAX_ITERATIONS", 2)
    spec = load_cluster(CLUSTER_SPECS / "geo24.yaml")
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    placement = {**{f"east-a100-{i}": (8 * i, 8 * i + 8) for i in range(4)},
                 **{f"eu-t4-{i}": (32 + 3 * i, 35 + 3 * i) for i in range(4)},
                 **{f"eu-l4-{i}": (44 + 8 * (i // 3), 52 + 8 * (i // 3)) for i in range(6)},
                 **{f"west-t4-{i}": (60 + 6 * (i // 4), 66 + 6 * (i // 4)) for i in range(8)},
                 "west-l4-0": (72, 76), "west-l4-1": (76, 80)}
    plan_ = evaluate_placement(problem, placement, True, "one-pair crossings")
    with pytest.raises(NoFixedPoint):
        predict(spec, plan_, cost, latencies=False, strict=True)
    with caplog.at_level("WARNING", logger="helix.planner.prediction"):
        predict(spec, plan_, cost, latencies=False)
    assert "no fixed point within" in caplog.text
