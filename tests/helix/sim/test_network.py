import pytest

from helix.sim.engine import SimConfig
from helix.sim.network import LinkParams, Network
from tests.builders.plans import two_node_plan
from tests.builders.sims import burst, make_sim


def test_fifo_link_queues_and_nic_is_shared():
    net = Network(lambda a, b: LinkParams(1e6, 0.01), lambda v: 2e6 if v == "a" else None)
    assert net.send(0.0, "a", "b", 1000) == pytest.approx(0.001 + 0.01)
    assert net.send(0.0, "a", "b", 1000) == pytest.approx(0.002 + 0.01)  # waits for the first
    # Another link from 'a': its own 1 MB/s, but a's NIC is busy until 2 ms.
    assert net.send(0.0, "a", "c", 1000) == pytest.approx(0.003 + 0.01)
    assert net.send(0.0, "x", "c", 1000) == pytest.approx(0.001 + 0.01)  # x has no NIC limit
    busy, sent = net.link_stats()[("a", "b")]
    assert busy == pytest.approx(0.002) and sent == 2000


def test_fair_link_shares_bandwidth_equally():
    net = Network(lambda a, b: LinkParams(1e6, 0.01), sharing="fair")
    link, wake = net.start_shared(0.0, "a", "b", 1000, "small")
    assert wake == pytest.approx(0.001)
    link, wake = net.start_shared(0.0, "a", "b", 3000, "big")
    assert wake == pytest.approx(0.002)  # 1000 B at half of 1 MB/s
    done, wake = net.wake_shared(0.002, link)
    assert done == ["small"] and wake == pytest.approx(0.004)  # 2000 B left at full speed
    done, wake = net.wake_shared(0.004, link)
    assert done == ["big"] and wake is None
    assert net.link_stats()[("a", "b")] == (pytest.approx(0.004), 4000)


def test_fair_sharing_gives_the_same_timeline_when_links_are_idle():
    runs = [make_sim(two_node_plan(), burst(1, 10, 3),
                     SimConfig(duration_s=None, link_sharing=s)).run() for s in ("fifo", "fair")]
    assert runs[0].ttft.mean_s == pytest.approx(runs[1].ttft.mean_s, abs=1e-12)
    assert runs[0].duration_s == pytest.approx(runs[1].duration_s, abs=1e-12)


def test_fair_sharing_lets_decodes_pass_queued_prompts():
    # A slow link and a burst of long prompts: with FIFO the first decode token waits behind every
    # prompt; with fair sharing it gets its share at once.
    wl = burst(8, 400, 20, gap_s=0.3)
    res = {s: make_sim(two_node_plan(), wl, SimConfig(mode="online", duration_s=None, link_sharing=s,
                                                      chunk_tokens=0),
                       bandwidth_bytes_per_s=5e4).run() for s in ("fifo", "fair")}
    for r in res.values():
        assert r.requests_completed == 8 and r.tokens_generated == 160
    assert res["fair"].inter_token_latency.p99_s < 0.2 * res["fifo"].inter_token_latency.p99_s
