"""Pod security, availability and wiring of every workload the manifests render."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from .conftest import KUSTOMIZATIONS, find, one, pod_spec, render, workloads

AUDITOR = "gpu-fence-auditor"
#: The auditor's documented exceptions (auditor-daemonset.yaml, docs/threat-model.md): root with these two
#: capabilities, hostPID, and these host paths, read-only.
AUDITOR_CAPABILITIES = {"SYS_PTRACE", "DAC_READ_SEARCH"}
AUDITOR_HOST_PATHS = {"/proc", "/var/lib/kubelet/pod-resources", "/run/nvidia/driver"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def all_workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(target, w) for target in KUSTOMIZATIONS for w in workloads(render(target))]


def ids(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}:{item[1]['kind']}/{item[1]['metadata']['name']}"


@pytest.mark.parametrize("item", all_workloads(), ids=ids)
def test_every_container_is_locked_down(item: tuple[str, dict[str, Any]]) -> None:
    _, workload = item
    spec = pod_spec(workload)
    is_auditor = workload["metadata"]["name"] == AUDITOR
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert bool(spec.get("hostPID")) == is_auditor
    for container in containers(spec):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert not context.get("privileged")
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["seccompProfile"]["type"] == "RuntimeDefault"
        added = set(context["capabilities"].get("add", []))
        if is_auditor:
            assert added == AUDITOR_CAPABILITIES
            assert context["runAsUser"] == 0
        else:
            assert added == set()
            run_as_non_root = context.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot"))
            user = context.get("runAsUser", spec["securityContext"].get("runAsUser"))
            assert run_as_non_root is True and isinstance(user, int) and user > 0, "explicit non-root uid"
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, "a writable /tmp on a read-only root filesystem"


@pytest.mark.parametrize("item", all_workloads(), ids=ids)
def test_host_paths_are_only_the_auditors_read_only_mounts(item: tuple[str, dict[str, Any]]) -> None:
    _, workload = item
    spec = pod_spec(workload)
    host_volumes = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    if workload["metadata"]["name"] != AUDITOR:
        assert host_volumes == {}
        return
    assert set(host_volumes.values()) <= AUDITOR_HOST_PATHS
    for container in containers(spec):
        for mount in container.get("volumeMounts", []):
            if mount["name"] in host_volumes:
                assert mount.get("readOnly") is True, mount


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_webhook_deployment_survives_disruption(target: str) -> None:
    objects = render(target)
    deployment = one(objects, "Deployment", "gpu-fence-webhook")
    spec = deployment["spec"]
    template = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] >= 2
    assert template["affinity"]["podAntiAffinity"]
    assert template["automountServiceAccountToken"] is False
    pdb = one(objects, "PodDisruptionBudget", "gpu-fence-webhook")
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert 1 <= pdb["spec"]["minAvailable"] < spec["replicas"]
    (container,) = template["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["lifecycle"]["preStop"], "a drain pause before SIGTERM"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    volumes = {v["name"]: v for v in template["volumes"]}
    config_map = volumes["config"]["configMap"]["name"]
    assert config_map.startswith("gpu-fence-policy-"), "the generated, content-hashed ConfigMap"
    assert find(objects, "ConfigMap", config_map)
    assert volumes["tls"]["secret"]["secretName"] == "gpu-fence-webhook-tls"


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_policy_config_map_loads_with_the_webhooks_own_loader(target: str) -> None:
    from gpu_fence.webhook.config import load_config

    objects = render(target)
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gpu-fence-policy")
    ]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "policy.yaml"
        path.write_text(config_map["data"]["policy.yaml"], encoding="utf-8")
        config = load_config(str(path), own_namespace="gpu-fence")
    assert {"kube-system", "gpu-fence"} <= set(config.exempt_namespaces)
    if target == "overlays/gpu-operator":
        assert "gpu-operator" in config.exempt_namespaces


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_auditor_daemonset_reaches_what_it_audits(target: str) -> None:
    objects = render(target)
    daemonset = one(objects, "DaemonSet", AUDITOR)
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert spec["runtimeClassName"] == "nvidia"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/host/proc"]["name"]]["hostPath"]["path"] == "/proc"
    pod_resources = mounts["/var/lib/kubelet/pod-resources"]
    assert volumes[pod_resources["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert [p["containerPort"] for p in container["ports"]] == [10400], "not dcgm-exporter's 9400"
    assert spec["priorityClassName"] == "system-node-critical"
    service = one(objects, "Service", AUDITOR)
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    if target == "overlays/gpu-operator":
        assert mounts["/run/nvidia/driver"]["readOnly"] is True
        args = container["args"]
        assert args[args.index("--nvml-lib") + 1].startswith("/run/nvidia/driver/")


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_critical_priority_pods_have_a_quota_that_admits_them(target: str) -> None:
    """Clusters may limit the system-*-critical priority classes to namespaces with a matching ResourceQuota (GKE
    does, by default: "insufficient quota to match these scopes"); without one the webhook pods are never created."""
    objects = render(target)
    for workload in workloads(objects):
        priority = pod_spec(workload).get("priorityClassName", "")
        if not priority.startswith("system-"):
            continue
        spec = workload["spec"]
        surge = spec.get("strategy", {}).get("rollingUpdate", {}).get("maxSurge", 0)
        needed = spec.get("replicas", 1) + (surge if isinstance(surge, int) else 1)
        if workload["kind"] == "DaemonSet":
            needed = 5000  # one pod per GPU node, of a large fleet
        quotas = [
            q
            for q in find(objects, "ResourceQuota")
            if q["metadata"].get("namespace") == workload["metadata"].get("namespace")
            and any(
                e["scopeName"] == "PriorityClass" and e["operator"] == "In" and priority in e["values"]
                for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", [])
            )
        ]
        assert quotas, f"{workload['metadata']['name']}: no ResourceQuota admits priority class {priority}"
        for quota in quotas:
            assert int(quota["spec"]["hard"]["pods"]) >= needed, "room for every replica and the rollout surge"
