"""Every kustomization builds, and every object it renders is valid for a current Kubernetes."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from .conftest import KUSTOMIZATIONS, MANIFESTS, NAMESPACE, render

#: The Kubernetes version whose OpenAPI schemas the objects must satisfy: the newest that the installed
#: kubernetes-validate ships (1.37 at the time of writing), in strict mode (unknown fields are errors).
KUBERNETES_VERSION = kubernetes_validate.latest_version()

#: Custom resources kubernetes-validate has no schema for. Each is named with the reason it is not validated
#: here; any other kind without a schema fails the test.
NO_SCHEMA = {
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD: kubernetes-validate ships core API schemas only",
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD: kubernetes-validate ships core API schemas only",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator CRD: no schema in kubernetes-validate",
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator CRD: no schema in kubernetes-validate",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-operator CRD: no schema in kubernetes-validate",
}


def test_the_installed_validator_knows_a_current_kubernetes() -> None:
    major, minor = (int(part) for part in KUBERNETES_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 30), "ValidatingAdmissionPolicy v1 and matchConditions need >= 1.30 schemas"


def test_overlays_exist_for_the_documented_setups() -> None:
    for name in ("base", "overlays/cert-manager", "overlays/gpu-operator", "overlays/warn-only", "overlays/vap"):
        assert name in KUSTOMIZATIONS


def test_the_release_install_is_the_base() -> None:
    """README's `kubectl apply -k manifests/` renders, and installs exactly what the overlays build on."""
    assert render(".") == render("base")


def test_every_overlay_builds_on_the_base() -> None:
    for target in KUSTOMIZATIONS:
        if target.startswith("overlays/"):
            text = (MANIFESTS / target / "kustomization.yaml").read_text(encoding="utf-8")
            assert "resources:\n  - ../../base\n" in text, target


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_every_rendered_object_validates(target: str) -> None:
    objects = render(target)
    assert objects, f"{target} rendered nothing"
    errors: list[str] = []
    for obj in objects:
        key = (obj.get("apiVersion"), obj.get("kind"))
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            errors.append(f"{name}: {path}: {error.message}")
        except SchemaNotFoundError:
            if key not in NO_SCHEMA:
                errors.append(f"{name}: no schema for {key} and not in the explicit NO_SCHEMA list")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_namespaced_objects_land_in_the_gpu_fence_namespace(target: str) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in render(target):
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_no_two_objects_share_kind_namespace_and_name(target: str) -> None:
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in render(target)]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_service_monitors_select_a_service_port_that_exists(target: str) -> None:
    objects = render(target)
    services = [o for o in objects if o["kind"] == "Service"]
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        wanted = monitor["spec"]["selector"].get("matchLabels", {})
        selected = [s for s in services if all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        assert selected, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        ports = {p.get("name") for s in selected for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports, (monitor["metadata"]["name"], endpoint["port"])
