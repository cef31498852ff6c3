"""The components, rendered as docs/install.md uses them. kube-prometheus-stack selects ServiceMonitors and
PrometheusRules by their ``release`` label: its component adds
it to exactly those objects (with another release name too). The gitops component keeps the certificate Job and
puts the webhook Deployment in a later Argo CD sync wave."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, RELEASE_URL, REPO, kubectl, render

SELECTED = ("ServiceMonitor", "PrometheusRule")


def build(directory: Path, kustomization: str) -> list[dict[str, Any]]:
    directory.mkdir()
    local = os.path.relpath(MANIFESTS, directory)
    (directory / "kustomization.yaml").write_text(
        RELEASE_URL.sub(lambda match: local + match.group(1), kustomization), encoding="utf-8"
    )
    result = run_captured([kubectl(), "kustomize", str(directory)], timeout=120)
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def selected_by_prometheus() -> set[tuple[str, str]]:
    """Every ServiceMonitor and PrometheusRule the prometheus overlay ships."""
    return {(o["kind"], o["metadata"]["name"]) for o in render("overlays/prometheus") if o["kind"] in SELECTED}


def releases(objects: list[dict[str, Any]]) -> dict[tuple[str, str], str | None]:
    return {(o["kind"], o["metadata"]["name"]): o["metadata"].get("labels", {}).get("release") for o in objects}


def test_the_component_labels_exactly_the_objects_prometheus_selects(tmp_path: Path) -> None:
    objects = build(
        tmp_path / "mine",
        "resources:\n  - https://github.com/gpu-fence/gpu-fence//manifests/overlays/prometheus?ref=v0\n"
        "components:\n  - https://github.com/gpu-fence/gpu-fence//manifests/components/kube-prometheus-stack?ref=v0\n",
    )
    labelled = releases(objects)
    selected = {key: value for key, value in labelled.items() if key[0] in SELECTED}
    assert set(selected) == selected_by_prometheus() and set(selected.values()) == {"kube-prometheus-stack"}
    assert {value for key, value in labelled.items() if key[0] not in SELECTED} == {None}
    # otherwise the overlay as it is
    assert {key: None for key in labelled} == {key: None for key in releases(render("overlays/prometheus"))}


def test_the_install_doc_kustomization_for_another_release_name_builds(tmp_path: Path) -> None:
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    block = re.search(r"### kube-prometheus-stack.*?```yaml\n(.*?)```", text, re.S)
    assert block, "the kustomization of the kube-prometheus-stack section"
    selected = {k: v for k, v in releases(build(tmp_path / "doc", block.group(1))).items() if k[0] in SELECTED}
    assert set(selected) == selected_by_prometheus() and set(selected.values()) == {"monitoring"}


def test_the_gitops_component_keeps_the_job_and_syncs_the_webhook_after_its_certificate(tmp_path: Path) -> None:
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    block = re.search(r"The kustomization the Application or the Flux.*?```yaml\n(.*?)```", text, re.S)
    assert block, "the kustomization of the Argo CD and Flux section"
    objects = build(tmp_path / "gitops", block.group(1))
    [job] = [o for o in objects if o["kind"] == "Job"]
    assert "ttlSecondsAfterFinished" not in job["spec"], "a Job the TTL removes is drift to a GitOps tool"
    waves = {
        (o["kind"], o["metadata"]["name"]): o["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave")
        for o in objects
    }
    assert waves.pop(("Deployment", "gpu-fence-webhook")) == "1"
    assert set(waves.values()) == {None}, "everything else, the Job included, in wave 0"
    unchanged = {(o["kind"], o["metadata"]["name"]) for o in render("overlays/warn-only")}
    assert set(waves) | {("Deployment", "gpu-fence-webhook")} == unchanged
