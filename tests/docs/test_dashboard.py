"""docs/grafana-dashboard.json: a dashboard Grafana imports, drawing only metrics walflow serves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.docs.metrics import METRICS
from tests.pipeline import ROOT

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"

@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def _queries(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def test_a_dashboard_grafana_imports(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36 and dashboard["id"] is None and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    panels = list(_panels(dashboard))
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and all(t["datasource"] == panel["datasource"] for t in panel["targets"])


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_metric_is_one_walflow_serves_and_each_is_drawn(dashboard: dict[str, Any]) -> None:
    used = set()
    for query in _queries(dashboard):
        assert query.count("(") == query.count(")") and query.count("{") == query.count("}"), query
        for name in re.findall(r"\bwalflow_\w+", query):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base != name:
                assert METRICS.get(base) == "histogram", f"{name}: {base} is not a histogram"
                name = base
            assert name in METRICS, f"{name} is not a metric walflow serves: {query}"
            used.add(name)
        if "histogram_quantile" in query:
            assert re.search(r"_bucket\{[^}]*\}\[\$__rate_interval\]", query) and "by (le" in query, query
    assert used == set(METRICS), f"not drawn: {sorted(set(METRICS) - used)}"


def test_counters_are_drawn_as_rates(dashboard: dict[str, Any]) -> None:
    for query in _queries(dashboard):
        if query.startswith("label_values"):
            continue
        for name in re.findall(r"\bwalflow_\w+_total\b", query):
            assert re.search(rf"(rate|increase)\({name}\{{", query), f"{name} drawn as a raw counter: {query}"
