"""``deploy/grafana/helix-dashboard.json``: it loads, takes its Prometheus data source as an import
input, every panel has a title and a unit, and every query names only series and labels that
``/metrics`` really exports (the metrics module's own text, scraped from a stub coordinator)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from helix.net.stats import WorkerStats
from helix.server.metrics import ServingMetrics
from tests.conftest import REPO_ROOT

parser = pytest.importorskip("prometheus_client.parser")

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "helix-dashboard.json"
SERIES = re.compile(r"\bhelix:[A-Za-z0-9_:]+")
# `name{a="x", b!="y"}`: the label names matched on a series.
SELECTOR = re.compile(r"(helix:[A-Za-z0-9_:]+)\{([^}]*)\}")
BY = re.compile(r"\bby\s*\(([^)]*)\)")


class _StubCoordinator:
    """What ``ServingMetrics.render`` reads of a coordinator: two nodes, one of them dead."""

    num_running, num_waiting, capacity_fraction = 3, 1, 0.5
    requests_moved, moved_prefill_tokens = 2, 40
    restarts = Counter({"n0": 0, "n1": 1})
    stats = {"n0": WorkerStats("n0", True, 0, 2, 10, 0, 16, "float32", 8, 0, 0, 0, 1, 0.0, None,
                               None, False, num_preemptions_total=0)}

    def node_states(self):
        return {"n0": "ok", "n1": "dead"}

    def kv_usage_fraction(self):
        return {"n0": 0.25, "n1": 0.0}

    def queue_limit(self):
        return 8


def exported() -> dict[str, set[str]]:
    """Every sample name ``/metrics`` renders -> the label names it carries."""
    m = ServingMetrics("m")
    m.first_token(0.1)
    m.next_token(0.01)
    m.finished("stop", 1.0, 0.0, 5, 3, started=True)
    text = m.render(_StubCoordinator()).decode()
    out: dict[str, set[str]] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def test_dashboard_loads_with_its_data_source_as_an_input():
    d = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    assert d["title"] and d["uid"]
    assert {v["name"] for v in d["templating"]["list"]} == {"model_name"}
    for p in panels():
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in p["targets"])
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_panel_has_a_title_a_unit_and_queries(panel):
    assert panel["title"].strip() and panel["description"].strip()
    assert panel["fieldConfig"]["defaults"]["unit"]
    assert panel["targets"] and all(t["expr"].count("(") == t["expr"].count(")")
                                    for t in panel["targets"])


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_panel_queries_name_only_exported_series_and_labels(panel):
    series = exported()
    for target in panel["targets"]:
        expr = target["expr"]
        names = SERIES.findall(expr)
        assert names, expr
        unknown = sorted(set(names) - set(series))
        assert not unknown, f"{panel['title']}: {unknown} are not exported"
        for name, matchers in SELECTOR.findall(expr):
            labels = {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",") if m.strip()}
            assert labels <= series[name], (name, labels - series[name])
        carried = set.intersection(*(series[n] for n in names))
        for group in BY.findall(expr):
            wanted = {g.strip() for g in group.split(",")} - {"le"}
            assert wanted <= carried, (expr, wanted - carried)
        for legend in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
            assert legend in carried, (expr, legend)


def test_every_exported_family_has_a_panel():
    """Not a rule for every series (adapter caches and lengths have no panel), but the core ones."""
    queried = {n for p in panels() for t in p["targets"] for n in SERIES.findall(t["expr"])}
    for name in ("helix:time_to_first_token_seconds_bucket", "helix:inter_token_latency_seconds_bucket",
                 "helix:kv_cache_usage_perc", "helix:node_state", "helix:num_requests_running",
                 "helix:num_requests_waiting", "helix:generation_tokens_total",
                 "helix:request_success_total", "helix:node_restarts", "helix:requests_moved"):
        assert name in queried, name
