"""The cost dashboard of the prometheus overlay: shipped as the ConfigMap the Grafana sidecar loads, a ``cluster``
variable of the main dashboard's shape applied to every series a query reads, and only series the chargeback rules
record. Every query runs against a real Prometheus, and its figures against the bill, in
``tests/chargeback/test_cost_dashboard.py``."""

from __future__ import annotations

import json
import re

import yaml

from .conftest import MANIFESTS, find, render

OVERLAY = MANIFESTS / "overlays" / "prometheus"
DASHBOARD = OVERLAY / "gpu-fence-cost-dashboard.json"
SELECTOR = re.compile(r"\b([a-z_]+:[a-z_]+:[a-z0-9_]+|gpu_fence_[a-z_]+)(\{[^}]*\})?")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels() -> list[dict]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def test_the_overlay_ships_it_as_its_own_configmap_the_grafana_sidecar_loads() -> None:
    [configmap] = find(render("overlays/prometheus"), "ConfigMap", "gpu-fence-cost-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {"gpu-fence-cost-dashboard.json": DASHBOARD.read_text(encoding="utf-8")}
    assert find(render("overlays/prometheus"), "ConfigMap", "gpu-fence-dashboard")  # beside the main one


def test_panels_are_well_formed_and_cover_what_finance_asks() -> None:
    document = dashboard()
    assert document["uid"] == "gpu-fence-cost"
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
    titles = {panel["title"] for panel in panels()}
    assert {
        "GPU cost per namespace",
        "Cost of the range per namespace",
        "Cost of the range per team",
        "Idle capacity",
        "Unattributed memory",
        "Used without an allocation",
        "GPU cost of the range",
    } <= titles


def test_a_cluster_variable_of_the_main_dashboards_shape_filters_every_series() -> None:
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["query"]["query"] == cluster["definition"] == "label_values(gpu_fence_gpu_info, cluster)"
    assert (cluster["includeAll"], cluster["allValue"], cluster["multi"]) == (True, ".*", True)
    for panel in panels():
        for target in panel["targets"]:
            found = SELECTOR.findall(target["expr"])
            assert found, panel["title"]
            for name, matchers in found:
                assert 'cluster=~"$cluster"' in matchers, f"{panel['title']}: {name}{matchers} is not filtered"
            # joins keep clusters apart: the same node name in two clusters is two cards
            for joined in re.findall(r"on \(([^)]*)\)", target["expr"]):
                assert joined.split(", ")[0] == "cluster", (panel["title"], joined)


def test_it_reads_only_series_the_chargeback_rules_record() -> None:
    rules = yaml.safe_load((OVERLAY / "chargeback-rules.yaml").read_text(encoding="utf-8"))
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"]}
    recorded.add("card:gpu_fence_chargeback_price:per_hour")  # the price group, written with --rules --prices
    for panel in panels():
        for target in panel["targets"]:
            for name, _matchers in SELECTOR.findall(target["expr"]):
                assert name in recorded, f"{panel['title']}: {name} is not a chargeback rule's series"
