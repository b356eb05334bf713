"""``deploy/grafana/helix-dashboard.json``: it loads, takes its Prometheus data source as an import
input, every panel has a title and a unit, and every query names only series, labels and label
values that ``/metrics`` really exports (the metrics module's own text, scraped from a stub
coordinator)."""

from __future__ import annotations

import json
import re

import pytest

from helix.server.metrics import ServingMetrics
from tests.builders.metrics import StubCoordinator, scrape
from tests.conftest import REPO_ROOT

pytest.importorskip("prometheus_client.parser")

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "helix-dashboard.json"
SERIES = re.compile(r"\bhelix:[A-Za-z0-9_:]+")
# `name{a="x", b!="y"}`: the label names matched on a series.
SELECTOR = re.compile(r"(helix:[A-Za-z0-9_:]+)\{([^}]*)\}")
# One matcher of a selector: label, operator, value.
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
BY = re.compile(r"\bby\s*\(([^)]*)\)")


def exported_values() -> dict[str, dict[str, set[str]]]:
    """Every sample name ``/metrics`` renders -> each label it carries -> the values seen."""
    m = ServingMetrics("m")
    m.first_token(0.1)
    m.next_token(0.01)
    m.finished("stop", 1.0, 0.0, 5, 3, started=True)
    out: dict[str, dict[str, set[str]]] = {}
    for s in scrape(m, StubCoordinator()):
        for label, value in s.labels.items():
            out.setdefault(s.name, {}).setdefault(label, set()).add(value)
    return out


def exported() -> dict[str, set[str]]:
    """Every sample name ``/metrics`` renders -> the label names it carries."""
    return {name: set(labels) for name, labels in exported_values().items()}


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


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_panel_queries_match_only_exported_label_values(panel):
    """A value matched on a label (``kind="replan_applied"``, ``state!="ok"``, each alternative of
    ``kind=~"a|b"``) is one ``/metrics`` renders; a misspelt one would match nothing, silently."""
    values = exported_values()
    for target in panel["targets"]:
        for name, matchers in SELECTOR.findall(target["expr"]):
            for label, op, value in MATCHER.findall(matchers):
                if value.startswith("$"):
                    continue   # a dashboard variable
                wanted = value.split("|") if op in ("=~", "!~") else [value]
                unknown = sorted(set(wanted) - values[name][label])
                assert not unknown, f"{panel['title']}: {name}{{{label}}} has no {unknown}"


def test_cluster_events_have_panels():
    """Re-plans (decided, applied) and failures, restarts and lost nodes over time."""
    matched = {}
    for p in panels():
        for t in p["targets"]:
            for name, matchers in SELECTOR.findall(t["expr"]):
                for label, _, value in MATCHER.findall(matchers):
                    if name == "helix:cluster_events_total" and label == "kind":
                        matched.setdefault(p["title"], set()).update(value.split("|"))
    assert {"replan_decided", "replan_applied"} <= matched["Re-plans"]
    assert {"failure", "restart", "lost"} <= matched["Node events"]


def test_every_exported_family_has_a_panel():
    """Not a rule for every series (adapter caches and lengths have no panel), but the core ones."""
    queried = {n for p in panels() for t in p["targets"] for n in SERIES.findall(t["expr"])}
    for name in ("helix:time_to_first_token_seconds_bucket", "helix:inter_token_latency_seconds_bucket",
                 "helix:kv_cache_usage_perc", "helix:node_state", "helix:num_requests_running",
                 "helix:num_requests_waiting", "helix:generation_tokens_total",
                 "helix:request_success_total", "helix:node_restarts", "helix:requests_moved",
                 "helix:cluster_events_total"):
        assert name in queried, name
