"""``check`` over the manifests of common stacks (``tests/webhook/data/stacks/``): the ordinary GPU workloads and the
infrastructure around them are admitted (pinned where they have containers without a GPU), and what reaches the
node is rejected with a message that names its way out; taking that way out clears it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_fence.webhook import cli
from tests.fakes.pods import KUBERNETES_VERSION
from tests.fakes.stacks import EXPECTED, STACKS

BUILT_IN = {"Pod", "Deployment", "DaemonSet", "Job"}


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["check", *args, "--format", "json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, json.loads(captured.out)


def by_file(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for result in report["results"]:
        found.setdefault(Path(result["source"]).name, []).append(result)
    return found


def test_every_stack_file_is_in_the_table() -> None:
    assert {path.name for path in STACKS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_built_in_objects_are_what_the_api_server_accepts(name: str) -> None:
    document = yaml.safe_load((STACKS / name).read_text(encoding="utf-8"))
    assert document["metadata"]["namespace"]  # every object says where it runs: the way out names it
    if document["kind"] in BUILT_IN:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_check_admits_the_workloads_and_rejects_what_reaches_the_node(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = check_json(capsys, str(STACKS))
    assert code == 1  # the three that reach the node
    found = by_file(report)
    for name, expected in EXPECTED.items():
        got = [(r["path"], r["verdict"], tuple(r["pinned"]), {v["rule"] for v in r["violations"]}) for r in found[name]]
        assert got == [(e.path, e.verdict, e.pinned, set(e.rules)) for e in expected], name
        for result, entry in zip(found[name], expected, strict=True):
            assert all(entry.way_out in v["message"] for v in result["violations"]), name
            assert result["warnings"] == [], name


def test_taking_the_named_way_out_clears_each_rejection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # node-exporter and dcgm-exporter: the exempt_service_accounts entries their messages name
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "exempt_service_accounts:\n"
        "  - monitoring/kube-prometheus-stack-prometheus-node-exporter\n"
        "  - gpu-monitoring/dcgm-exporter\n"
    )
    code, report = check_json(
        capsys, str(STACKS / "node-exporter.yaml"), str(STACKS / "dcgm-exporter.yaml"), "--config", str(policy)
    )
    assert code == 0 and [r["verdict"] for r in report["results"]] == ["exempt", "exempt"]
    # zero-to-jupyterhub with singleuser.cloudMetadata.blockWithIptables: false spawns the pod without the init
    # container
    document = yaml.safe_load((STACKS / "z2jh-gpu-singleuser.yaml").read_text(encoding="utf-8"))
    del document["spec"]["initContainers"]
    unblocked = tmp_path / "singleuser.yaml"
    unblocked.write_text(yaml.safe_dump(document))
    code, report = check_json(capsys, str(unblocked))
    assert code == 0 and [r["verdict"] for r in report["results"]] == ["allowed"]


def test_without_net_admin_on_the_allowlist_the_mesh_init_containers_name_their_cni(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("allowed_capabilities: [CHOWN, NET_RAW]\n")
    meshes = [str(STACKS / name) for name in ("istio-gpu-inference.yaml", "linkerd-gpu-worker.yaml")]
    code, report = check_json(capsys, *meshes, "--config", str(policy))
    assert code == 1
    istio, linkerd = report["results"]
    assert [v["rule"] for v in istio["violations"]] == ["added-capability"]
    assert "components.cni.enabled=true" in istio["violations"][0]["message"]
    assert [v["rule"] for v in linkerd["violations"]] == ["added-capability"]
    assert "cniEnabled: true" in linkerd["violations"][0]["message"]
