"""The rules of pod annotations that ask the container runtime for devices or mounts: CDI's own (a GPU path), and
the prefixes CRI-O, NRI plugins and CDI injection read (which reach the node).

Both rules keep their keys from one pass over the annotations (:func:`~webhook.policy.pod.device_annotation_keys`).
Annotations can change after creation: ``validate_update`` judges the ones an update adds or changes.
"""

from __future__ import annotations

from ...config import CDI_ANNOTATION_PREFIXES
from ..pod import PodView, device_annotation_keys
from ..registry import Reach, rule
from ..values import RuleId, Violation, quote


@rule(
    RuleId.CDI_ANNOTATION,
    "a pod annotation under cdi.k8s.io/ or nvidia.cdi.k8s.io, which asks for CDI devices",
    vectors=("V9", "V10"),
)
def cdi_annotation(pod: PodView) -> list[Violation]:
    return _annotation_violations(pod, RuleId.CDI_ANNOTATION, CDI_ANNOTATION_PREFIXES, "the runtime for CDI devices")


@rule(
    RuleId.RUNTIME_ANNOTATION,
    "a pod annotation under a forbidden prefix (CRI-O devices, NRI device, CDI device and mount injection)",
    vectors=("V20",),
    reach=Reach.NODE,
)
def runtime_annotation(pod: PodView) -> list[Violation]:
    return _annotation_violations(
        pod,
        RuleId.RUNTIME_ANNOTATION,
        pod.config.forbidden_annotation_prefixes,
        "the container runtime or an NRI plugin for devices or mounts",
    )


def _annotation_violations(pod: PodView, rule_id: RuleId, prefixes: tuple[str, ...], asks: str) -> list[Violation]:
    if not pod.whole_pod:  # annotations were judged when the pod was created (updates: validate_update)
        return []
    keys = device_annotation_keys(pod)
    if not keys:
        return []
    return [
        Violation(
            rule_id,
            None,
            f"pod annotation {quote(key)} asks {asks}",
            f"remove the annotation {quote(key)} and request nvidia.com/gpu",
        )
        for key in keys
        if key.startswith(prefixes)
    ]
