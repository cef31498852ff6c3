"""KAI's reference: the one ``valueFrom`` and the one ``envFrom`` that KAI's webhook writes on its fraction
container, to ConfigMaps that KAI's binder fills for it, and why one that only looks like them is refused.

Sources: kai-scheduler/KAI-Scheduler d5bc503a, ``pkg/binder/common/gpu_access.go`` (``AddGPUSharingEnvVars``),
``env_vars.go`` (``AddDirectEnvVarsConfigMapSource``), ``gpusharingconfigmap/config_map.go``; the names themselves are
``gpu_fence.kai``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_fence import kai
from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV

from .pod import ContainerView, PodView, bound_at_creation, mapping


def config_map_prefix(pod: PodView) -> str | None:
    """The prefix of the ConfigMaps KAI fills for the pod (its annotation), where it has KAI's form."""
    prefix = mapping(pod.metadata.get("annotations")).get(kai.SHARED_GPU_CONFIG_MAP_ANNOTATION)
    if isinstance(prefix, str) and kai.SHARED_GPU_CONFIG_MAP_PREFIX.fullmatch(prefix):
        return prefix
    return None


def is_kai_reference(pod: PodView, container: ContainerView, entry: Mapping[str, Any]) -> bool:
    """The one ``valueFrom`` allowed: on KAI's fraction container, exactly the required ``configMapKeyRef`` that
    KAI's webhook writes, to the ConfigMap its binder fills for this container (named after the pod's prefix
    annotation and the container's place). Any other ConfigMap would be one the pod author filled."""
    value_from = entry.get("valueFrom")
    if entry.get("value") not in (None, "") or not isinstance(value_from, dict):
        return False
    if list(value_from) != ["configMapKeyRef"]:
        return False
    reference = value_from["configMapKeyRef"]
    prefix = config_map_prefix(pod)
    return (
        isinstance(reference, dict)
        and prefix is not None
        and reference.get("name") == _capabilities_config_map(prefix, container)
        and reference.get("key") == VISIBLE_DEVICES_ENV
        and reference.get("optional") in (None, False)
    )


def _capabilities_config_map(prefix: str, container: ContainerView) -> str:
    return kai.capabilities_config_map(prefix, init=container.field == "initContainers", index=container.position)


def is_kai_env_source(pod: PodView, container: ContainerView, source: Any) -> bool:
    """KAI's own ``envFrom`` on its fraction container: its ``-evar`` ConfigMap, required."""
    prefix = config_map_prefix(pod)
    if prefix is None or not isinstance(source, dict) or list(source) != ["configMapRef"]:
        return False
    reference = source["configMapRef"]
    expected = kai.direct_env_config_map(prefix, init=container.field == "initContainers", index=container.position)
    return (
        isinstance(reference, dict) and reference.get("name") == expected and reference.get("optional") in (None, False)
    )


def value_from_problem(pod: PodView, container: ContainerView, name: str) -> str | None:
    """Why a ``valueFrom`` that looks like KAI's is not accepted, when the pod asks for a KAI fraction."""
    annotations = mapping(pod.metadata.get("annotations"))
    if name != VISIBLE_DEVICES_ENV or not any(key in annotations for key in kai.FRACTION_ANNOTATIONS):
        return None
    scheduler = pod.spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in pod.config.kai_scheduler_set:
        return None
    if bound_at_creation(pod.spec):
        return (
            f"sets {name} through valueFrom on a KAI fraction pod created with spec.nodeName, which no KAI "
            "scheduler or binder ever sees, so the ConfigMap is the pod author's"
        )
    if container.kai_fraction:
        return f"sets {name} through valueFrom, but not as KAI's reference to the ConfigMap KAI fills for it"
    return None
