"""The coordinator hop (helix.sim.hop): a FIFO token server and the CPU it takes from busy workers,
against hand-computed timelines of the two-node plan (links 1 MB/s + 10 ms; a layer costs 1 ms per
prompt token and 10 ms per decode sequence; see test_engine's hand-computed timeline)."""

from pathlib import Path

import pytest
import yaml

from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.hop import CoordinatorHop
from helix.sim.workload import TraceRequest
from helix.core.spec import parse_cluster
from tests.builders.plans import two_node_plan
from tests.builders.sims import burst, make_sim, single24_plan

REPO = Path(__file__).resolve().parents[3]


class _Busy:
    def __init__(self, name: str, busy: bool) -> None:
        self.name, self.busy = name, busy


def test_tokens_queue_in_order_and_busy_workers_share_the_cpu():
    hop = CoordinatorHop(token_s=0.005, shared_s=0.004)
    a, b, c = _Busy("A", True), _Busy("B", True), _Busy("C", False)
    assert hop.deliver(0.0, [a, b, c]) == pytest.approx(0.005)
    assert hop.deliver(0.001, [a, b, c]) == pytest.approx(0.010)   # waits behind the first
    b.busy = False
    assert hop.deliver(0.5, [a, b, c]) == pytest.approx(0.505)     # an idle server: no wait
    # A was busy for all three tokens, B for two (2 + 2 ms) and C never (its core was free).
    assert hop.charge(a) == pytest.approx(0.002 + 0.002 + 0.004)
    assert hop.charge(b) == pytest.approx(0.004)
    assert hop.charge(c) == 0.0
    assert hop.charge(a) == 0.0   # paid once
    idle = CoordinatorHop(shared_s=0.004)
    idle.deliver(0.0, [c])
    assert idle.owed_s == {}


def _run(workload, hop):
    sim = make_sim(two_node_plan(), workload, SimConfig(mode="online", duration_s=None))
    sim.hop = hop
    return sim, sim.run()


def test_the_caller_sees_tokens_after_the_coordinators_fifo():
    # Two requests at 0: request 1's first token reaches the coordinator at 71.044 ms (test_engine's
    # TTFT); request 2's waits behind it at A (one 20 ms prompt step) and every stage after, 20 ms
    # later. A 30 ms server: request 1's is seen at 101.044 ms, request 2's waits for it until then.
    first = (40 / 1e6 + 0.01) + 0.020 + (1000 / 1e6 + 0.01) + 0.020 + (4 / 1e6 + 0.01)
    _, r = _run(burst(2, 10, 1), None)
    assert list(r.samples["ttft_s"]) == pytest.approx([first, first + 0.020])
    _, r = _run(burst(2, 10, 1), CoordinatorHop(token_s=0.030))
    assert list(r.samples["ttft_s"]) == pytest.approx([first + 0.030, first + 0.060])


def test_a_request_is_scheduled_once_the_coordinator_handled_it():
    # Two one-token requests at 0 and a 30 ms request service: request 1 is dispatched at 30 ms,
    # request 2 behind it at 60 ms (A is idle again by then: request 1 left it at 60.04 ms), so
    # each first token comes test_engine's TTFT after its dispatch.
    first = (40 / 1e6 + 0.01) + 0.020 + (1000 / 1e6 + 0.01) + 0.020 + (4 / 1e6 + 0.01)
    _, r = _run(burst(2, 10, 1), CoordinatorHop(request_s=0.030))
    assert list(r.samples["ttft_s"]) == pytest.approx([0.030 + first, 0.060 + first])
    assert r.requests_completed == 2


def test_cpu_taken_while_a_worker_steps_lengthens_its_next_step():
    # Request 1 (prompt 10, 2 tokens) at 0, request 2 (prompt 10, 1 token) at 55 ms. Request 1's
    # first token reaches the coordinator at 71.044 ms (test_engine's TTFT), while A prefills
    # request 2 (65.04-85.04 ms) and B is idle: its 4 ms of CPU are A's. A's next step (request 1's
    # decode, fed back at 81.048 ms) runs 85.04 -> 85.04 + 20 + 4 ms; its hidden state reaches B
    # 10.1 ms later (B, busy with request 2's prompt until 116.04 ms, is free), B decodes for 20 ms
    # and the token is back 10.004 ms later.
    first = (40 / 1e6 + 0.01) + 0.020 + (1000 / 1e6 + 0.01) + 0.020 + (4 / 1e6 + 0.01)
    second = 0.08504 + 0.020 + 0.004 + (100 / 1e6 + 0.01) + 0.020 + (4 / 1e6 + 0.01)
    workload = (TraceRequest(0.0, 10, 2), TraceRequest(0.055, 10, 1))
    sim, r = _run(workload, CoordinatorHop(shared_s=0.004))
    assert sorted(r.samples["ttft_s"]) == pytest.approx([first, first])
    assert list(r.samples["itl_s"]) == pytest.approx([second - first])
    # A stepped 3 times (20 + 20 ms of prompts, a 20 ms decode) and paid 4 ms; B's 4 ms from
    # request 2's token (taken while B decoded request 1) is still owed: B never stepped again.
    assert sim.workers["A"].busy_s == pytest.approx(0.064)
    assert sim.hop.owed_s == {"B": pytest.approx(0.004)}
    _, plain = _run(workload, None)
    assert list(plain.samples["itl_s"]) != pytest.approx([second - first])


def test_the_spec_gives_the_figures_and_none_leaves_the_simulator_free():
    data = yaml.safe_load((REPO / "cluster_specs" / "single24.yaml").read_text())
    spec = parse_cluster(data)
    config, workload = SimConfig(duration_s=None), (TraceRequest(0.0, 100, 3),)
    assert build_simulator(spec, single24_plan(spec), workload, config).hop is None
    measured = parse_cluster({**data, "coordinator": {**data.get("coordinator", {}),
                                                      "token_cpu": "250us", "shared_cpu": "0.4ms",
                                                      "request_cpu": "3ms"}})
    hop = build_simulator(measured, single24_plan(measured), workload, config).hop
    assert (hop.token_s, hop.shared_s, hop.request_s) == \
        (pytest.approx(250e-6), pytest.approx(4e-4), pytest.approx(3e-3))
    # Written back with units, read back the same (what bench_live's calibration writes).
    again = parse_cluster(yaml.safe_load(measured.to_yaml()))
    assert again.coordinator == measured.coordinator
    assert spec.content_hash() == parse_cluster(data).content_hash()


@pytest.mark.parametrize("tasks", [False, True])
def test_offline_requests_pass_the_coordinator_first_with_or_without_task_placement(tasks):
    # Offline, two one-token requests of one task and a 30 ms request service: each joins the
    # queue when the coordinator can take the next and is dispatched once handled (30 and 60 ms),
    # whether or not tasks are placed (the task scheduler's lookahead takes its requests from the
    # same pull, through the same hop).
    from coordinator.task_placement import PlacementConfig
    from helix.sim.tasks import task_placement
    first = (40 / 1e6 + 0.01) + 0.020 + (1000 / 1e6 + 0.01) + 0.020 + (4 / 1e6 + 0.01)
    plan = two_node_plan()
    workload = tuple(TraceRequest(0.0, 10, 1, "t0") for _ in range(2))
    sim = make_sim(plan, workload, SimConfig(mode="offline", duration_s=None))
    if tasks:
        sim._init_tasks(task_placement(plan, ["t0"], PlacementConfig()))
    sim.hop = CoordinatorHop(request_s=0.030)
    dispatched: list[float] = []
    start = sim._start

    def timed(now_s, req, pipeline):
        dispatched.append(now_s)
        return start(now_s, req, pipeline)
    sim._start = timed
    r = sim.run()
    assert (sim.placement is not None) == tasks
    assert dispatched == pytest.approx([0.030, 0.060])
    # Offline TTFT counts from dispatch (a saturated queue has no arrival time to speak of).
    assert list(r.samples["ttft_s"]) == pytest.approx([first, first])
    assert r.requests_completed == 2
