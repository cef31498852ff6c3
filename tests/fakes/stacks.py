"""The manifests of common stacks under ``tests/webhook/data/stacks/`` and what the default policy must do with each.

One table for the three ways the policy runs (``check``, the webhook served over TLS, the ValidatingAdmissionPolicy):
every pod spec of every file, with its verdict, the containers pinned, the rules broken and, for a rejection, the way
out its message must name. The pod specs are found as ``check`` finds them (``webhook.discovery``), in the namespace
each object names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_fence.webhook.discovery import find_pod_specs, pod_for_site

STACKS = Path(__file__).resolve().parents[1] / "webhook" / "data" / "stacks"


@dataclass(frozen=True)
class Expected:
    """What the default policy does with one pod spec: ``way_out`` is text the rejection must carry."""

    path: str
    verdict: str
    pinned: tuple[str, ...] = ()
    rules: frozenset[str] = frozenset()
    way_out: str = ""


NODE_EXPORTER_WAY_OUT = '"monitoring/kube-prometheus-stack-prometheus-node-exporter" to exempt_service_accounts'
DCGM_EXPORTER_WAY_OUT = '"gpu-monitoring/dcgm-exporter" to exempt_service_accounts'
Z2JH_WAY_OUT = "singleuser.cloudMetadata.blockWithIptables: false"

EXPECTED: dict[str, list[Expected]] = {
    "istio-gpu-inference.yaml": [Expected("", "mutated", ("istio-init", "istio-proxy"))],
    "istio-web.yaml": [Expected("spec.template", "mutated", ("istio-init", "web", "istio-proxy"))],
    "linkerd-gpu-worker.yaml": [Expected("", "mutated", ("linkerd-init", "linkerd-proxy"))],
    "pytorchjob-multinode.yaml": [
        Expected("spec.pytorchReplicaSpecs.Master.template", "allowed"),
        Expected("spec.pytorchReplicaSpecs.Worker.template", "allowed"),
    ],
    "numa-training-job.yaml": [Expected("spec.template", "allowed")],
    "vllm.yaml": [Expected("spec.template", "allowed")],
    "kuberay.yaml": [
        Expected("spec.headGroupSpec.template", "mutated", ("ray-head",)),
        Expected("spec.workerGroupSpecs[0].template", "allowed"),
    ],
    "kserve-knative.yaml": [Expected("", "mutated", ("storage-initializer", "queue-proxy"))],
    "cpu-notebook-cuda.yaml": [Expected("spec.template", "mutated", ("eda",))],
    "z2jh-gpu-singleuser.yaml": [
        Expected("", "rejected", ("block-cloud-metadata",), frozenset({"privileged"}), Z2JH_WAY_OUT)
    ],
    "node-exporter.yaml": [
        Expected(
            "spec.template",
            "rejected",
            ("node-exporter",),
            frozenset({"host-pid", "host-device-path"}),
            NODE_EXPORTER_WAY_OUT,
        )
    ],
    "dcgm-exporter.yaml": [
        Expected(
            "spec.template",
            "rejected",
            ("exporter",),
            frozenset({"sys-admin-capability", "host-device-path"}),
            DCGM_EXPORTER_WAY_OUT,
        )
    ],
}


@dataclass(frozen=True)
class StackPod:
    """One pod spec of a stack's file, as the API server would see the Pod it makes, and what must happen to it."""

    file: str
    namespace: str
    pod: dict[str, Any]
    expected: Expected

    @property
    def id(self) -> str:
        return f"{self.file}:{self.expected.path or 'Pod'}"


def stack_pods() -> list[StackPod]:
    found: list[StackPod] = []
    for name, expected in EXPECTED.items():
        with (STACKS / name).open(encoding="utf-8") as stream:
            [obj] = [document for document in yaml.safe_load_all(stream) if document]
        namespace = obj["metadata"]["namespace"]
        sites = find_pod_specs(obj)
        assert len(sites) == len(expected), name
        for site, entry in zip(sites, expected, strict=True):
            found.append(StackPod(name, namespace, pod_for_site(site, obj, namespace), entry))
    return found
