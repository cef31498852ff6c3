"""The way out of a rejection for trusted infrastructure: the upstream setting that removes the need, or the exact
exemption to configure.

Pure, and advice only: no decision reads it. An image name or a service account is the pod author's to choose, so
a pod that looks like node-exporter is judged like any other; what its look buys is a message that names the
setting its chart or mesh has, or the ``exempt_service_accounts`` entry an administrator would add (who can then
check that the pod is what it claims to be). ``webhook.policy`` asks here once per violation, never on the path of
a pod that breaks nothing.

Three kinds of known infrastructure, each with its own way out:

* **injected** containers, added to ordinary workloads by a mesh or a chart (``istio-init``, ``linkerd-init``,
  zero-to-jupyterhub's ``block-cloud-metadata``): the setting that stops adding them. Exempting the workload's
  service account would exempt the workload itself.
* **node agents** that read the node or every GPU by design (node-exporter, dcgm-exporter): the service account
  to exempt, or the namespace to switch off.
* **GPU Operator operands**: their namespace, which ``manifests/overlays/gpu-operator`` exempts.

Any other violation of a rule that guards the node gets the generic form: if the pod is a trusted node agent, the
``exempt_service_accounts`` entry for its own service account.

Sources of the settings named: Istio ``manifests/charts/istio-control/istio-discovery/files/injection-template.yaml``
(``istio-init`` with ``NET_ADMIN``/``NET_RAW`` unless ``istio_cni.enabled``; ``enable-core-dump`` privileged with
``global.proxy.enableCoreDump``), Linkerd ``charts/partials/templates/_proxy-init.tpl`` (``linkerd-init`` unless
``cniEnabled``; privileged with ``proxyInit.closeWaitTimeoutSecs``), zero-to-jupyterhub ``jupyterhub/values.yaml``
(``singleuser.cloudMetadata.blockWithIptables``: "will append a privileged initContainer").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["KNOWN_IMAGES", "Infrastructure", "KnownImage", "WayOut", "image_repository", "way_out"]


class Infrastructure(Enum):
    """What kind of trusted infrastructure a container looks like, which decides the way out."""

    INJECTED = "injected"
    NODE_AGENT = "node agent"
    GPU_OPERATOR = "GPU Operator operand"


@dataclass(frozen=True)
class KnownImage:
    """Infrastructure known by its image's repository (no registry, tag or digest), and where the container name
    tells two uses of one image apart, by that name too."""

    repository: str
    kind: Infrastructure
    advice: str
    container: str | None = None


_OPERANDS = (
    "nvidia/gpu-operator",
    "nvidia/cloud-native/gpu-operator-validator",
    "nvidia/cloud-native/k8s-driver-manager",
    "nvidia/cloud-native/k8s-mig-manager",
    "nvidia/cloud-native/vgpu-device-manager",
    "nvidia/k8s-device-plugin",
    "nvidia/gpu-feature-discovery",
    "nvidia/k8s/container-toolkit",
    "nvidia/k8s/dcgm",
    "nvidia/driver",
)

KNOWN_IMAGES: tuple[KnownImage, ...] = (
    KnownImage(
        "istio/proxyv2",
        Infrastructure.INJECTED,
        "Istio adds istio-init: install Istio CNI (istioctl install --set components.cni.enabled=true) and it goes",
        container="istio-init",
    ),
    KnownImage(
        "istio/proxyv2",
        Infrastructure.INJECTED,
        "Istio adds it with global.proxy.enableCoreDump: set that to false",
        container="enable-core-dump",
    ),
    KnownImage(
        "linkerd/proxy-init",
        Infrastructure.INJECTED,
        "Linkerd adds linkerd-init: install the Linkerd CNI plugin and set cniEnabled: true (it is privileged only "
        "with proxyInit.closeWaitTimeoutSecs)",
    ),
    KnownImage(
        "jupyterhub/k8s-network-tools",
        Infrastructure.INJECTED,
        "zero-to-jupyterhub adds it: set singleuser.cloudMetadata.blockWithIptables: false (singleuser.networkPolicy "
        "still blocks the cloud metadata server)",
    ),
    KnownImage("prometheus/node-exporter", Infrastructure.NODE_AGENT, "node-exporter reads the node by design"),
    KnownImage("nvidia/k8s/dcgm-exporter", Infrastructure.NODE_AGENT, "dcgm-exporter watches every GPU by design"),
    *(KnownImage(repository, Infrastructure.GPU_OPERATOR, "a GPU Operator operand") for repository in _OPERANDS),
)

#: The known images of each repository (one repository can have several uses, told apart by container name).
_BY_REPOSITORY: dict[str, tuple[KnownImage, ...]] = {
    repository: tuple(known for known in KNOWN_IMAGES if known.repository == repository)
    for repository in dict.fromkeys(known.repository for known in KNOWN_IMAGES)
}


def image_repository(image: str) -> str:
    """The repository of an image reference, without registry, tag or digest: ``nvcr.io/nvidia/k8s/dcgm-exporter:4.2``
    and ``nvidia/k8s/dcgm-exporter@sha256:...`` are ``nvidia/k8s/dcgm-exporter``; Docker Hub's ``library/`` is
    dropped."""
    name = image.partition("@")[0]
    head, slash, last = name.rpartition("/")
    name = f"{head}{slash}{last.partition(':')[0]}"
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        name = rest
    return name.removeprefix("library/")


@dataclass(frozen=True)
class WayOut:
    """The way out of one violation. ``replaces_fix``: the pod looks like known infrastructure, whose manifest its
    user does not write, so this is the whole advice, not an alternative to changing the workload."""

    text: str
    replaces_fix: bool


def _known(container: Mapping[str, Any]) -> KnownImage | None:
    image = container.get("image")
    if not isinstance(image, str):
        return None
    name = container.get("name")
    for known in _BY_REPOSITORY.get(image_repository(image), ()):
        if known.container is None or known.container == name:
            return known
    return None


def _account(spec: Mapping[str, Any]) -> str | None:
    """The pod's service account when it names one; None for ``default`` (the ServiceAccount admission plugin's
    default), which every pod in the namespace may use, so exempting it would exempt them all."""
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    return account if isinstance(account, str) and account != "default" else None


def _exemption(namespace: str, spec: Mapping[str, Any]) -> str:
    account = _account(spec)
    if account is None:
        return "run it under a service account of its own and add that to exempt_service_accounts"
    return f'add "{namespace}/{account}" to exempt_service_accounts (policy.yaml)'


def way_out(
    *,
    guards_node: bool,
    container: Mapping[str, Any] | None,
    spec: Mapping[str, Any],
    containers: list[Mapping[str, Any]],
    namespace: str,
) -> WayOut | None:
    """The way out for one violation: ``container`` is the violating container (None for a pod-level
    rule, which takes the first node agent or operand among ``containers``); ``guards_node`` says whether the rule
    guards the node (any such violation gets at least the generic exemption). None when there is nothing to add
    to the rule's own fix."""
    if container is not None:
        known = _known(container)
    else:
        found = (_known(body) for body in containers)
        known = next((k for k in found if k is not None and k.kind is not Infrastructure.INJECTED), None)
    if known is not None and known.kind is Infrastructure.INJECTED:
        return WayOut(known.advice, replaces_fix=True)
    if known is not None and known.kind is Infrastructure.GPU_OPERATOR:
        return WayOut(
            f"{known.advice}: exempt namespace {namespace} (exempt_namespaces and the webhooks' namespaceSelector; "
            "manifests/overlays/gpu-operator does both for gpu-operator)",
            replaces_fix=True,
        )
    if known is not None:
        return WayOut(
            f"{known.advice}: {_exemption(namespace, spec)}, or label namespace {namespace} gpu-fence.io/mode=off",
            replaces_fix=True,
        )
    if guards_node:
        return WayOut(f"if it is a trusted node agent, {_exemption(namespace, spec)}", replaces_fix=False)
    return None
