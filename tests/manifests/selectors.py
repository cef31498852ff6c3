"""Kubernetes label-selector matching, as the API server applies a webhook's namespaceSelector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy ``selector`` (an absent or empty selector matches everything)."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


def namespace_labels(name: str, mode: str | None = None) -> dict[str, str]:
    """The labels a namespace carries: the API server always sets kubernetes.io/metadata.name."""
    labels = {"kubernetes.io/metadata.name": name}
    if mode is not None:
        labels["gpu-fence.io/mode"] = mode
    return labels
