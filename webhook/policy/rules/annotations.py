"""The rules of pod annotations that ask the runtime for devices or mounts."""

from __future__ import annotations

from ...config import CDI_ANNOTATION_PREFIXES
from ..pod import _mapping, _Pod
from ..values import CDI_ANNOTATION, RUNTIME_ANNOTATION, Violation, _quote


def _annotation_violations(pod: _Pod, rule: str, prefixes: tuple[str, ...], asks: str) -> list[Violation]:
    """The violations of one annotation rule. The keys under any rule's prefix are found in one pass over the
    annotations, by the first of the two rules; the second reads that pass."""
    if not pod.whole_pod:  # annotations were judged when the pod was created (updates: validate_update)
        return []
    keys = pod.memo.get("annotations")
    if keys is None:
        by_first = pod.config.device_annotation_prefixes
        keys = [
            key
            for key in _mapping(pod.metadata.get("annotations"))
            if isinstance(key, str) and (under := by_first.get(key[:1])) is not None and key.startswith(under)
        ]
        pod.memo["annotations"] = keys
    if not keys:
        return []
    return [
        Violation(
            rule,
            None,
            f"pod annotation {_quote(key)} asks {asks}",
            f"remove the annotation {_quote(key)} and request nvidia.com/gpu",
        )
        for key in keys
        if key.startswith(prefixes)
    ]


def cdi_annotation(pod: _Pod) -> list[Violation]:
    return _annotation_violations(pod, CDI_ANNOTATION, CDI_ANNOTATION_PREFIXES, "the runtime for CDI devices")


def runtime_annotation(pod: _Pod) -> list[Violation]:
    return _annotation_violations(
        pod,
        RUNTIME_ANNOTATION,
        pod.config.forbidden_annotation_prefixes,
        "the container runtime or an NRI plugin for devices or mounts",
    )
