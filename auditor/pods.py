"""A pod as the Kubernetes API returns it (a plain dict), read for what names its containers: each container id
with its name and spec list, the pod's labels, its KAI GPU groups. Pure: ``auditor.kube`` lists the pods,
``auditor.snapshot`` joins them with the other sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_fence.kai import GPU_GROUP_LABEL, MULTI_GPU_GROUP_LABEL_PREFIX

STATUS_FIELDS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
#: The pod spec list each status list describes: an Event's fieldPath must name the list the container is in.
SPEC_FIELDS = {
    "initContainerStatuses": "initContainers",
    "containerStatuses": "containers",
    "ephemeralContainerStatuses": "ephemeralContainers",
}


def strip_runtime(container_id: str) -> str:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` → ``<id>`` (the cgroup's form)."""
    return container_id.split("://", 1)[-1]


def containers_by_id(pod: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """container id → (container name, spec list: ``containers``, ``initContainers`` or ``ephemeralContainers``),
    over init, regular and ephemeral container statuses."""
    found: dict[str, tuple[str, str]] = {}
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return found
    for field in STATUS_FIELDS:
        entries = status.get(field)
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, Mapping) and entry.get("containerID") and entry.get("name"):
                found[strip_runtime(str(entry["containerID"]))] = (str(entry["name"]), SPEC_FIELDS[field])
    return found


def container_names_by_id(pod: Mapping[str, Any]) -> dict[str, str]:
    """container id → container name, over init, regular and ephemeral container statuses."""
    return {container_id: name for container_id, (name, _) in containers_by_id(pod).items()}


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}


def kai_gpu_groups(pod: Mapping[str, Any]) -> frozenset[str]:
    """The KAI GPU groups a pod belongs to: label ``runai-gpu-group=<g>``, or ``runai-gpu-group/<g>`` (multi-GPU
    fractions), both set by the KAI binder on fraction pods and on their reservation pods."""
    groups: set[str] = set()
    for key, value in pod_labels(pod).items():
        if key == GPU_GROUP_LABEL and value:
            groups.add(value)
        elif key.startswith(MULTI_GPU_GROUP_LABEL_PREFIX) and key != MULTI_GPU_GROUP_LABEL_PREFIX:
            groups.add(key[len(MULTI_GPU_GROUP_LABEL_PREFIX) :])
    return frozenset(groups)
