"""The live view of a real serving stack: ``GET /v1/cluster``'s frame (every key, its type) and
``/dashboard`` in the system's headless Chromium, driven by Playwright, while requests run: live
numbers appear, a worker that is killed turns dead within the health settings' time and its
pipeline's requests move to the others, a drained node shows draining, and the page fetches nothing
but its own origin. Screenshots of each state go to the test's temporary folder.

The stack is ``helix serve``'s own (tests.builders.serve_stack) over the demo's tiny model: cpu-0
[0,4) feeding cpu-1 [2,8) in its region and cpu-2, cpu-3 [4,8) in another, so a node can die and
another drain with a pipeline left. cpu-2 is a ``helix worker`` subprocess, the one killed (SIGKILL);
the others are WorkerServers in this process."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import playwright.sync_api as playwright
import pytest

from coordinator.health import HealthConfig
from coordinator.runtime import RuntimeConfig
from helix.core.plan import ArcFlow, Plan
from helix.core.slices import LayerSlice
from helix.core.spec import parse_cluster
from helix.server.app import create_app
from helix.server.guard import HttpOptions
from helix.server.http import HttpThread
from planner.live_view import check_frame, render_page
from tests.builders.frames import frame as small_frame
from tests.builders.serve_stack import ServeCluster
from tests.builders.serving import PROMPTS, with_kv
from tests.builders.stack import MODEL_NAME
from tests.builders.traffic import in_flight_on, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
HEALTH = HealthConfig(suspect_after_s=0.5, dead_after_s=1.5)
POLL_S = 1.0
"""How often the page asks for a frame."""
API_KEY = "dashboard-test-key"


def four_node_plan() -> Plan:
    nodes = ("cpu-1", "cpu-2", "cpu-3")
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice("cpu-0", 0, 4), LayerSlice("cpu-1", 2, 8),
                            LayerSlice("cpu-2", 4, 8), LayerSlice("cpu-3", 4, 8)),
                arc_flows=(ArcFlow("coordinator", "cpu-0", 300.0),
                           *(ArcFlow("cpu-0", n, 100.0) for n in nodes),
                           *(ArcFlow(n, "coordinator", 100.0) for n in nodes)),
                max_flow_tokens_per_s=300.0, method="test")
    return with_kv(plan, 4096)


SPEC = {"model": "tiny-llama", "dtype": "float32", "coordinator": {"region": "us-east"},
        "regions": {"us-east": {"bandwidth": "1GB/s"}, "eu-west": {"bandwidth": "1GB/s"}},
        "inter_region": {"bandwidth": "100Mbps", "latency": "50ms"},
        "nodes": [{"name": "cpu-0", "gpu": "CPU", "gpus": 4, "memory": "3000KiB", "region": "us-east"},
                  {"name": "cpu-1", "gpu": "CPU", "memory": "1500KiB", "region": "us-east"},
                  {"name": "cpu-2", "gpu": "CPU", "memory": "1500KiB", "region": "eu-west"},
                  {"name": "cpu-3", "gpu": "CPU", "memory": "1500KiB", "region": "eu-west"}]}


class Traffic:
    """Greedy completions, ``clients`` at a time, until :meth:`stop`; counts what failed."""

    def __init__(self, url: str, clients: int = 6) -> None:
        self.url, self.failed, self._stop = url, [], threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self, k: int) -> None:
        i = k
        while not self._stop.is_set():
            r = httpx.post(self.url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 32,
                "temperature": 0})
            if r.status_code != 200:
                self.failed.append(r.text)
            i += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


@pytest.fixture(scope="module")
def served(tiny_model):
    """(cluster, the server's URL, a key-guarded app's URL over the same coordinator)."""
    config = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60, health=HEALTH)
    spec = parse_cluster(SPEC)
    with ServeCluster(tiny_model[0], four_node_plan(), config, processes=("cpu-2",),
                      model_name=MODEL_NAME, cluster=spec, replan_poll_s=None) as cluster:
        stack = cluster.stack
        open_http = HttpThread(stack.app)
        keyed_http = HttpThread(create_app(stack.coordinator, MODEL_NAME, stack.metrics,
                                           HttpOptions(api_key=API_KEY), cluster=spec))
        try:
            yield cluster, open_http.url, keyed_http.url
        finally:
            open_http.stop()
            keyed_http.stop()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, url: str):
    """A new page at ``url`` and the list of every URL it requests (filled as it runs)."""
    page = browser.new_page(viewport={"width": 1280, "height": 680})
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(url)
    return page, requested


def frames_seen(page) -> int:
    return int(page.evaluate("+(document.body.dataset.frames || 0)"))


def wait_frames(page, n: int, timeout_s: float = 30) -> None:
    """Until the page has drawn ``n`` more frames."""
    target = frames_seen(page) + n
    page.wait_for_function(f"+(document.body.dataset.frames || 0) >= {target}",
                           timeout=timeout_s * 1000)


def node_state(page, node: str) -> str:
    return page.get_attribute(f'g.node[data-node="{node}"]', "data-state")


def pipelines(page) -> dict[str, tuple[int, float | None]]:
    """Each pipeline row's (in flight, decode tokens/s) as the page shows them."""
    rows = page.eval_on_selector_all("tr[data-pipeline]", "rs => rs.map(r => [r.dataset.pipeline, "
                                     "+r.dataset.inFlight, r.dataset.rate])")
    return {p: (n, float(rate) if rate else None) for p, n, rate in rows}


def only_own_origin(requested: list[str], origin: str) -> None:
    others = [u for u in requested if not u.startswith(origin + "/")]
    assert not others, f"the page fetched other origins: {others}"


def test_the_frame_has_every_key_with_its_type(served):
    _, url, _ = served
    traffic = Traffic(url, clients=3)
    try:
        first = httpx.get(url + "/v1/cluster", timeout=30).json()
        time.sleep(2.5)
        frame = httpx.get(url + "/v1/cluster", timeout=30).json()
    finally:
        traffic.stop()
    assert check_frame(first) == [] and check_frame(frame) == [], check_frame(frame)
    assert frame["model"] == MODEL_NAME and frame["time_s"] > first["time_s"]
    assert [(n["name"], n["region"], n["layers"], n["state"]) for n in frame["nodes"]] == [
        ("cpu-0", "us-east", [0, 4], "serving"), ("cpu-1", "us-east", [2, 8], "serving"),
        ("cpu-2", "eu-west", [4, 8], "serving"), ("cpu-3", "eu-west", [4, 8], "serving")]
    assert {n["gpu"] for n in frame["nodes"]} == {"CPU"}
    assert all(n["kv_capacity_tokens"] >= 4096 and n["steps_per_s"] > 0 and 0 < n["busy"] <= 1
               for n in frame["nodes"]), frame["nodes"]
    assert [p["id"] for p in frame["pipelines"]] == ["cpu-0>cpu-1", "cpu-0>cpu-2", "cpu-0>cpu-3"]
    assert sum(p["decode_tokens_per_s"] for p in frame["pipelines"]) > 0
    links = {(k["from_region"], k["to_region"]): k for k in frame["links"]}
    assert set(links) == {("us-east", "eu-west"), ("eu-west", "us-east")}
    assert links["us-east", "eu-west"]["bandwidth_bytes_per_s"] == 100e6 / 8
    assert links["us-east", "eu-west"]["bytes_per_s"] > 0   # activations from cpu-0 to cpu-2, cpu-3
    c = frame["cluster"]
    assert c["window_s"] == 60 and c["requests_per_s"] > 0
    assert 0 < c["ttft_p50_s"] <= c["ttft_p99_s"] and 0 < c["tpot_p50_s"] <= c["tpot_p99_s"]
    assert not traffic.failed, traffic.failed[:3]


def test_with_an_api_key_the_frame_needs_it_and_the_page_sends_the_one_it_was_given(served, browser,
                                                                                      tmp_path):
    _, _, keyed = served
    assert httpx.get(keyed + "/v1/cluster", timeout=30).status_code == 401
    headers = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(keyed + "/v1/cluster", headers=headers, timeout=30).status_code == 200
    assert httpx.get(keyed + "/dashboard", timeout=30).status_code == 200   # the page holds no data
    page, requested = open_page(browser, keyed + "/dashboard")
    page.wait_for_selector("#status.stale")
    assert page.text_content("#status") == "API key needed"
    page.fill("#keyinput", API_KEY)
    page.click("#keyform button")
    wait_frames(page, 1)
    page.close()
    # The key in the address's fragment (a new tab: nothing in its session storage): the server
    # never sees it, the page keeps it for the tab and takes it out of the address bar (the
    # current history entry; the browser's list of visited pages may still hold it).
    page, requested = open_page(browser, keyed + f"/dashboard#key={API_KEY}")
    wait_frames(page, 2)
    assert page.text_content("#status") == "live"
    assert API_KEY not in page.url
    assert not [u for u in requested if API_KEY in u.split("#")[0]]
    page.screenshot(path=tmp_path / "keyed.png")
    only_own_origin(requested, keyed)
    page.close()


def test_the_dashboard_shows_a_node_die_and_another_drain(served, browser, tmp_path):
    cluster, url, _ = served
    coord = cluster.coord
    traffic = Traffic(url)
    try:
        page, requested = open_page(browser, url + "/dashboard")
        wait_frames(page, 3)
        assert page.text_content("#status") == "live"
        assert float(page.text_content("#c-decode").replace(",", "")) > 0
        assert all(node_state(page, n) == "serving" for n in ("cpu-0", "cpu-1", "cpu-2", "cpu-3"))
        page.screenshot(path=tmp_path / "1-serving.png", full_page=True)

        until(lambda: in_flight_on(coord, "cpu-2"), 30, "a request generating through cpu-2")
        moved = coord.requests_moved
        killed = time.monotonic()
        worker = cluster.process("cpu-2")
        worker.send_signal(signal.SIGKILL)   # cpu-2's worker process: gone, its polls are refused
        page.wait_for_selector('g.node[data-node="cpu-2"][data-state="dead"]',
                               timeout=(HEALTH.dead_after_s + 10 * POLL_S) * 1000)
        dead_after_s = time.monotonic() - killed
        assert dead_after_s <= HEALTH.dead_after_s + 4 * POLL_S, dead_after_s
        assert coord.node_status("cpu-2").state == "dead" and worker.wait(timeout=5) == -signal.SIGKILL
        # Its requests moved: none in flight through cpu-2 (it decodes nothing), the others carry it.
        deadline = time.monotonic() + 20
        while True:
            wait_frames(page, 1)
            shown = pipelines(page)
            if (shown["cpu-0>cpu-2"] == (0, 0.0) and shown["cpu-0>cpu-1"][1] > 0
                    and shown["cpu-0>cpu-3"][1] > 0):
                break
            assert time.monotonic() < deadline, shown
        assert coord.requests_moved > moved   # those it held when it died go on elsewhere
        assert page.is_visible('.event[data-kind="failure"]')
        page.screenshot(path=tmp_path / "2-dead.png", full_page=True)

        r = httpx.post(url + "/admin/drain", json={"node": "cpu-3"}, timeout=30)
        assert r.status_code == 200, r.text
        page.wait_for_selector('g.node[data-node="cpu-3"][data-state="draining"]',
                               timeout=5 * POLL_S * 1000)
        page.wait_for_selector('.event[data-kind="drain"]', timeout=5 * POLL_S * 1000)
        deadline = time.monotonic() + 30
        while pipelines(page)["cpu-0>cpu-3"][0] > 0:   # its requests finish where they are
            assert time.monotonic() < deadline, pipelines(page)
            wait_frames(page, 1)
        page.screenshot(path=tmp_path / "3-draining.png", full_page=True)
        only_own_origin(requested, url)
        page.close()
    finally:
        traffic.stop()
    assert not traffic.failed, traffic.failed[:3]


def test_a_replay_shows_its_frames_under_a_slider(served, browser, tmp_path):
    _, url, _ = served
    frames = [httpx.get(url + "/v1/cluster", timeout=30).json() for _ in range(2)]
    start = frames[0]["time_s"]
    for f in frames:   # a simulated run's times start at 0
        f["time_s"] -= start
        for e in f["events"]:
            e["time_s"] -= start
    frames[0]["nodes"][0]["state"] = "suspect"
    path = tmp_path / "replay.html"
    path.write_text(render_page(frames, "replay"), encoding="utf-8")
    page, requested = open_page(browser, path.as_uri())
    page.wait_for_selector("#replay.shown")
    assert page.text_content("#status") == "replay of 2 frames"
    assert node_state(page, "cpu-0") == frames[1]["nodes"][0]["state"]   # the last frame first
    assert page.input_value("#slider") == "1"   # and the slider's thumb on it
    page.fill("#slider", "0")
    page.dispatch_event("#slider", "input")
    assert node_state(page, "cpu-0") == "suspect"
    page.screenshot(path=tmp_path / "replay.png", full_page=True)
    assert requested == [path.as_uri()]
    page.close()


def open_replay(browser, tmp_path, frames: list[dict]):
    """The replay page of ``frames`` opened from a file, its last frame drawn; (page, errors)."""
    path = tmp_path / "replay.html"
    path.write_text(render_page(frames, "replay"), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 680})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("#replay.shown", timeout=10_000)
    return page, errors


def test_a_link_bar_compares_its_bytes_with_the_bandwidth_of_every_node_pair_on_it(browser, tmp_path):
    f = small_frame(1.0)
    f["links"][0].update(bytes_per_s=3e6, bandwidth_bytes_per_s=1e7, node_pairs=3)
    page, errors = open_replay(browser, tmp_path, [f])
    row = page.locator('tr[data-link="us>eu"]')
    assert float(row.get_attribute("data-fraction")) == pytest.approx(0.1)   # 3 MB/s of 3 x 10 MB/s
    assert "3 \u00d7 10 MB/s" in row.text_content()
    assert errors == []
    page.close()


def test_a_replay_gives_each_frame_its_events_from_the_list_embedded_once(browser, tmp_path):
    frames = [small_frame(float(t)) for t in (10, 20, 30)]
    frames[0]["events"] = []
    frames[2]["events"] = frames[1]["events"] + [{"time_s": 25.0, "kind": "drain", "detail": "b drains"}]
    page, errors = open_replay(browser, tmp_path, frames)
    assert page.eval_on_selector_all(".event", "es => es.map(e => e.dataset.kind)") == ["drain", "failure"]
    page.fill("#slider", "0")
    page.dispatch_event("#slider", "input")
    assert page.locator(".event").count() == 0
    assert errors == []
    page.close()


def test_a_node_named_like_markup_is_drawn_as_text(browser, tmp_path):
    f = small_frame(1.0)
    f["nodes"][0]["name"] = f["pipelines"][0]["nodes"][0] = "a<!--<script>"
    f["pipelines"][0]["id"] = "a<!--<script>>b"
    page, errors = open_replay(browser, tmp_path, [f])
    assert page.text_content("#status") == "replay of 1 frames"
    assert page.locator('g.node[data-node="a<!--<script>"]').count() == 1
    assert errors == []
    page.close()


def test_a_node_serving_again_has_its_own_colour_on_the_timeline(browser, tmp_path):
    f = small_frame(10.0)   # its failure at 5 s
    f["events"].append({"time_s": 8.0, "kind": "return", "detail": "b is serving again (was dead)"})
    page, errors = open_replay(browser, tmp_path, [small_frame(5.0), f])
    colours = page.eval_on_selector_all(
        ".event .ev", "es => es.map(e => [e.textContent, getComputedStyle(e).backgroundColor])")
    assert dict(colours)["return"] not in {c for kind, c in colours if kind != "return"} | {"rgb(85, 85, 85)"}
    assert errors == []
    page.close()
