"""The Grafana dashboard of the prometheus overlay: shipped as the ConfigMap the Grafana sidecar loads, well formed,
and built only from series that exist. Every query runs against a real Prometheus in
``tests/chargeback/test_scrape.py``."""

from __future__ import annotations

import json
import re

import yaml

from .conftest import MANIFESTS, REPO, find, render

OVERLAY = MANIFESTS / "overlays" / "prometheus"
DASHBOARD = OVERLAY / "gpu-fence-dashboard.json"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels() -> list[dict]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def test_the_overlay_ships_it_as_a_configmap_the_grafana_sidecar_loads() -> None:
    [configmap] = find(render("overlays/prometheus"), "ConfigMap", "gpu-fence-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {"gpu-fence-dashboard.json": DASHBOARD.read_text(encoding="utf-8")}


def test_panels_are_well_formed() -> None:
    document = dashboard()
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    assert document["uid"] == "gpu-fence"
    variables = {variable["name"] for variable in document["templating"]["list"]}
    assert variables == {"datasource", "cluster", "namespace", "node"}
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"])
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]


def test_it_covers_both_deployables_and_the_chargeback_rules() -> None:
    titles = {panel["title"] for panel in panels()}
    for wanted in (
        "Overreach findings by namespace",
        "GPU memory by team",
        "Unattributed GPU memory by node",
        "Denials by rule",
        "Review latency",
        "Audit cycle duration",
        "Time since the last successful cycle",
        "SM activity per container",
        "Held GPUs without SM activity, last hour",
    ):
        assert wanted in titles
    expressions = " ".join(target["expr"] for panel in panels() for target in panel["targets"])
    rules = yaml.safe_load((OVERLAY / "rules.yaml").read_text(encoding="utf-8"))
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    assert recorded <= set(re.findall(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", expressions)), "a recording rule with no panel"


def test_it_names_only_series_that_exist() -> None:
    """Every series a query reads is a documented metric of either deployable, a shipped recording rule, or up."""
    metrics_doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(gpu_fence_[a-z_]+)`", metrics_doc, flags=re.M))
    rules = yaml.safe_load((OVERLAY / "rules.yaml").read_text(encoding="utf-8"))
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    for panel in panels():
        for target in panel["targets"]:
            for name in re.findall(
                r"\b((?:gpu_fence_|[a-z_]+:gpu_fence_)[a-z0-9_:]+|up)\b(?=\s*[{(\[)]|\s*$|\s)", target["expr"]
            ):
                base = re.sub(r"_(bucket|count|sum|total)$", "", name)
                assert name == "up" or name in recorded or base in documented or name in documented, (
                    f"{panel['title']}: {name} is neither a documented metric nor a recording rule"
                )


def test_per_gpu_tables_use_dcgm_exporter_label_names() -> None:
    """Where gpu-fence's labels mean what dcgm-exporter's do, the tables say it in dcgm-exporter's names, so that
    a row joins DCGM_FI_DEV_* series: UUID (the physical GPU, for a MIG slice its parent), modelName, GPU_I_PROFILE,
    Hostname (dcgm-exporter's chart sets it from the node name, as gpu-fence's node); namespace, pod and container
    are spelled alike already."""
    tables = [p for p in panels() if p["type"] == "table" and "gpu_uuid" in p["targets"][0]["expr"]]
    assert len(tables) == 5
    for title, expr in ((table["title"], target["expr"]) for table in tables for target in table["targets"]):
        for label, source in (
            ("UUID", "gpu_uuid"),
            ("UUID", "parent_uuid"),
            ("modelName", "model"),
            ("GPU_I_PROFILE", "mig_profile"),
            ("Hostname", "node"),
        ):
            assert f'"{label}", "$1", "{source}"' in expr, (title, label)


def test_activity_panels_sit_in_a_row_that_says_they_are_not_billed() -> None:
    """Compute activity is an operational signal (docs/metrics.md): a panel that reads it must not pass for a bill."""
    row = None
    readers = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        elif any("_activity_" in target["expr"] for target in panel["targets"]):
            readers.append((row, panel["title"]))
    assert len(readers) >= 4
    assert {row for row, _ in readers} == {"GPU activity (operational, not billed)"}, readers


def test_every_series_a_panel_reads_is_filtered_by_the_cluster_variable() -> None:
    """One dashboard for many clusters (Thanos, Mimir, federation): every selector carries cluster=~"$cluster",
    which also matches series without the label, so a single cluster's Prometheus needs nothing."""
    for panel in panels():
        for target in panel["targets"]:
            names = re.findall(
                r"\b((?:[a-z_]+:)?gpu_fence_[a-z0-9_]+(?::[a-z0-9_]+)?|up)\b(\{[^}]*\})?", target["expr"]
            )
            assert names, panel["title"]
            for name, selector in names:
                assert selector.startswith('{cluster=~"$cluster"'), (panel["title"], name)
    chained = {v["name"]: v["query"]["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"}
    assert chained.pop("cluster") == "label_values(gpu_fence_gpu_info, cluster)"
    assert all('{cluster=~"$cluster"}' in query for query in chained.values()), "namespaces and nodes of the cluster"
