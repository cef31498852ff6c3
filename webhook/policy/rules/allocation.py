"""The rules that guard the allocation itself: pods created bound to a node, KAI's bind-time annotations."""

from __future__ import annotations

from ..pod import _Pod
from ..values import BOUND_GPU_POD, KAI_ANNOTATION_UPDATE, Violation, _quote


def bound_gpu_pod(pod: _Pod) -> list[Violation]:
    """A pod created bound to a node is never fitted by the scheduler; the kubelet drops the extended resources its
    node does not advertise before its own fit, and no device plugin allocates them, so such a "GPU container" gets
    no allocation and keeps the image's ``NVIDIA_VISIBLE_DEVICES`` (docs/threat-model.md). Judged at creation only:
    ``spec.nodeName`` cannot be changed by an update, only set by a binding, which is the scheduler's."""
    node = pod.spec.get("nodeName")
    if node is None or node == "" or not pod.whole_pod:  # _bound_at_creation, inline: once per pod admitted
        return []
    gpus = [container.name for container in pod.containers if container.gpu]
    if not gpus:
        return []
    return [
        Violation(
            BOUND_GPU_POD,
            None,
            f"the pod is created with spec.nodeName, which skips the scheduler's resource fit, and container "
            f"{', '.join(_quote(name) for name in gpus)} requests a device-plugin GPU, which a node that does not "
            "advertise it runs with no allocation",
            "choose the node with a nodeSelector on kubernetes.io/hostname (or node affinity on metadata.name) "
            "instead of nodeName",
        )
    ]


def kai_annotation_update(pod: _Pod) -> list[Violation]:
    """Only ``validate_update`` finds changes to judge (it puts them in the memo): ``validate`` has no old pod."""
    changes: list[tuple[str, str]] = pod.memo.get("kai changes", _NO_CHANGES)
    return [
        Violation(
            KAI_ANNOTATION_UPDATE,
            None,
            f"the update {change} pod annotation {_quote(key)}, which KAI's binder reads at bind time to choose the "
            "ConfigMap it fills, while the fraction container's reference was written and judged at creation",
            "delete the pod and create it with the annotations it needs",
        )
        for key, change in changes
    ]


_NO_CHANGES: list[tuple[str, str]] = []
