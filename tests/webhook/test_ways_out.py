"""webhook.ways_out: the way out each kind of trusted infrastructure is told, and what everyone else is told."""

from __future__ import annotations

import pytest

from gpu_fence.webhook.ways_out import Infrastructure, image_repository, way_out


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04", "nvidia/k8s/dcgm-exporter"),
        ("nvidia/k8s/dcgm-exporter@sha256:0123", "nvidia/k8s/dcgm-exporter"),
        ("quay.io/prometheus/node-exporter:v1.8.2", "prometheus/node-exporter"),
        ("localhost:5000/istio/proxyv2:1.24.2", "istio/proxyv2"),
        ("localhost/jupyterhub/k8s-network-tools", "jupyterhub/k8s-network-tools"),
        ("docker.io/library/busybox:1.36", "busybox"),
        ("busybox", "busybox"),
        ("registry:5000/linkerd/proxy-init:v2.4.2@sha256:ab", "linkerd/proxy-init"),
    ],
)
def test_image_repository_drops_registry_tag_and_digest(image, repository):
    assert image_repository(image) == repository


def out(image: str, name: str = "c", *, guards_node: bool = True, account: str | None = "agent", pod_level=False):
    container = {"name": name, "image": image}
    spec = {"serviceAccountName": account} if account else {}
    return way_out(
        guards_node=guards_node,
        container=None if pod_level else container,
        spec=spec,
        containers=[container],
        namespace="team-a",
    )


def test_injected_containers_name_the_setting_that_removes_them_and_no_exemption():
    istio = out("docker.io/istio/proxyv2:1.24.2", "istio-init")
    assert istio.replaces_fix and "components.cni.enabled=true" in istio.text
    assert "exempt" not in istio.text  # the workload's own service account: exempting it exempts the workload
    assert "enableCoreDump" in out("docker.io/istio/proxyv2:1.24.2", "enable-core-dump").text
    assert "cniEnabled: true" in out("cr.l5d.io/linkerd/proxy-init:v2.4.2", "linkerd-init").text
    z2jh = out("quay.io/jupyterhub/k8s-network-tools:4.0.0", "block-cloud-metadata")
    assert "singleuser.cloudMetadata.blockWithIptables: false" in z2jh.text


def test_the_proxy_itself_is_no_known_init_container():
    """istio-proxy shares istio-init's image: it is not told to install Istio CNI."""
    proxy = out("docker.io/istio/proxyv2:1.24.2", "istio-proxy")
    assert proxy is not None and "CNI" not in proxy.text and not proxy.replaces_fix


def test_node_agents_are_told_their_exact_service_account_entry_or_to_get_one():
    exporter = out("quay.io/prometheus/node-exporter:v1.8.2", account="node-exporter")
    assert exporter.replaces_fix
    assert '"team-a/node-exporter" to exempt_service_accounts' in exporter.text
    assert "label namespace team-a gpu-fence.io/mode=off" in exporter.text
    on_default = out("nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3", account=None)
    assert "default" not in on_default.text and "a service account of its own" in on_default.text


def test_gpu_operator_operands_are_told_to_exempt_their_namespace():
    operand = out("nvcr.io/nvidia/k8s-device-plugin:v0.17.0")
    assert operand.replaces_fix and "exempt namespace team-a" in operand.text
    assert "overlays/gpu-operator" in operand.text


def test_a_pod_level_rule_takes_the_first_node_agent_and_never_an_injected_container():
    pod_level = way_out(
        guards_node=True,
        container=None,
        spec={"serviceAccountName": "ne"},
        containers=[
            {"name": "istio-init", "image": "istio/proxyv2:1.24"},
            {"name": "node-exporter", "image": "quay.io/prometheus/node-exporter:v1.8.2"},
        ],
        namespace="monitoring",
    )
    assert pod_level.replaces_fix and "node-exporter reads the node" in pod_level.text


def test_anything_else_gets_the_generic_exemption_on_node_rules_only():
    generic = out("ghcr.io/example/ci-runner:1")
    assert not generic.replaces_fix and generic.text.startswith("if it is a trusted node agent")
    assert '"team-a/agent"' in generic.text
    assert out("ghcr.io/example/ci-runner:1", guards_node=False) is None
    assert {kind.value for kind in Infrastructure} == {"injected", "node agent", "GPU Operator operand"}
