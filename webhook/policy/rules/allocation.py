"""The rules that guard the allocation itself: a GPU container of a pod created bound to a node (no scheduler fit,
so possibly no allocation), and a pod UPDATE that changes what KAI's binder reads when it fills a fraction's
ConfigMap. Both are GPU rules even where the pod could land on no GPU node (``Reach.GPU``): what they guard is that
the GPU a container uses is one the scheduler allocated.
"""

from __future__ import annotations

from ..pod import PodView, bound_at_creation
from ..registry import rule
from ..values import RuleId, Violation, quote


@rule(
    RuleId.BOUND_GPU_POD,
    "a pod created with spec.nodeName that has a device-plugin GPU container: it skips the scheduler's resource "
    "fit, and a node that does not advertise the resource runs it with no allocation",
    vectors=("V25",),
)
def bound_gpu_pod(pod: PodView) -> list[Violation]:
    """A pod created bound to a node is never fitted by the scheduler; the kubelet drops the extended resources its
    node does not advertise before its own fit, and no device plugin allocates them, so such a "GPU container" gets
    no allocation and keeps the image's ``NVIDIA_VISIBLE_DEVICES`` (docs/threat-model.md). Judged at creation only:
    ``spec.nodeName`` cannot be changed by an update, only set by a binding, which is the scheduler's."""
    if not pod.whole_pod or not bound_at_creation(pod.spec):
        return []
    gpus = [container.name for container in pod.containers if container.gpu]
    if not gpus:
        return []
    return [
        Violation(
            RuleId.BOUND_GPU_POD,
            None,
            f"the pod is created with spec.nodeName, which skips the scheduler's resource fit, and container "
            f"{', '.join(quote(name) for name in gpus)} requests a device-plugin GPU, which a node that does not "
            "advertise it runs with no allocation",
            "choose the node with a nodeSelector on kubernetes.io/hostname (or node affinity on metadata.name) "
            "instead of nodeName",
        )
    ]


@rule(
    RuleId.KAI_ANNOTATION_UPDATE,
    "a pod UPDATE that adds, removes or changes an annotation KAI's binder reads at bind time (the fraction, its "
    "container, the ConfigMap prefix) on a pod KAI schedules",
    vectors=("V26",),
    update_only=True,
)
def kai_annotation_update(pod: PodView) -> list[Violation]:
    """Only ``validate_update`` finds changes to judge (``PodView.kai_changes``): ``validate`` has no old pod."""
    return [
        Violation(
            RuleId.KAI_ANNOTATION_UPDATE,
            None,
            f"the update {change.value} pod annotation {quote(key)}, which KAI's binder reads at bind time to choose "
            "the ConfigMap it fills, while the fraction container's reference was written and judged at creation",
            "delete the pod and create it with the annotations it needs",
        )
        for key, change in pod.kai_changes
    ]
