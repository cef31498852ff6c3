"""A stand-in for the policy module: the review envelope's tests judge the envelope, not the rules.

The review calls its policy through a structural interface, so the stand-in's values are plain dataclasses of the
same shape as the policy's own (``Violation``, ``Validation``, ``Mutation``), not imports of them.

It pins non-GPU containers (only ``nvidia.com/gpu`` limits count), denies privileged containers and non-GPU
containers not pinned to ``void``/``none``, records every call, and can be told to raise or to warn.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.fakes.pods import apply_patch


@dataclass(frozen=True)
class Violation:
    """A violation (or a warning) with one text for every form the envelope asks for, and a way out if given."""

    rule: str
    container: str
    message: str
    way_out: str = ""

    @property
    def finding(self) -> str:
        return self.message

    @property
    def advice(self) -> str:
        return self.message


def advice(text: str) -> Violation:
    """A warning of the stand-in's (the policy's warnings carry a rule id; this one carries none of its own)."""
    return Violation("advice", "", text)


@dataclass(frozen=True)
class Validation:
    violations: tuple[Violation, ...]
    warnings: tuple[Violation, ...] = ()


@dataclass(frozen=True)
class Mutation:
    patch: tuple[dict, ...]
    pinned: tuple[str, ...]


def _containers(pod: dict, only):
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(spec.get(field) or []):
            if only is None or container.get("name") in only:
                yield field, index, container


def _is_gpu(container: dict) -> bool:
    return int((container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0)) > 0


class StandInPolicy:
    """Pins non-GPU containers; denies NVIDIA_VISIBLE_DEVICES=all on them and privileged containers."""

    def __init__(self, fail: Exception | None = None, warnings: tuple[str, ...] = ()) -> None:
        self.fail = fail
        self.warnings = tuple(advice(text) for text in warnings)
        self.calls: list[tuple[str, object]] = []

    def exemption(self, pod, config, *, namespace):
        self.calls.append(("exemption", namespace))
        if namespace == "kube-system":
            return "namespace kube-system is exempt"
        if "kubernetes.io/config.mirror" in (pod.get("metadata") or {}).get("annotations", {}):
            return "mirror pod"
        return None

    def mutate(self, pod, config, *, only=None):
        self.calls.append(("mutate", only))
        if self.fail:
            raise self.fail
        patch, pinned = [], []
        for field, index, container in _containers(pod, only):
            if _is_gpu(container):
                continue
            env = container.get("env")
            if env is None:
                patch.append(
                    {
                        "op": "add",
                        "path": f"/spec/{field}/{index}/env",
                        "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                    }
                )
            elif not any(e.get("name") == "NVIDIA_VISIBLE_DEVICES" for e in env):
                patch.append(
                    {
                        "op": "add",
                        "path": f"/spec/{field}/{index}/env/-",
                        "value": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                    }
                )
            else:
                continue
            pinned.append(container["name"])
        return Mutation(tuple(patch), tuple(pinned))

    def apply_patch(self, document, patch):
        self.calls.append(("apply_patch", len(patch)))
        return apply_patch(document, patch)

    def validate(self, pod, config, *, only=None, namespace=None):
        self.calls.append(("validate", only))
        if self.fail:
            raise self.fail
        found = []
        for _field, _index, container in _containers(pod, only):
            if (container.get("securityContext") or {}).get("privileged"):
                found.append(
                    Violation(
                        "privileged",
                        container["name"],
                        "privileged containers see every GPU; remove securityContext.privileged",
                    )
                )
            if not _is_gpu(container):
                env = container.get("env") or []
                values = [e.get("value") for e in env if e.get("name") == "NVIDIA_VISIBLE_DEVICES"]
                if not values or values[0] not in ("void", "none"):
                    found.append(
                        Violation(
                            "unpinned-container",
                            container["name"],
                            "request nvidia.com/gpu, or set NVIDIA_VISIBLE_DEVICES=void",
                        )
                    )
        return Validation(tuple(found), self.warnings)

    def validate_update(self, pod, old_pod, config, *, namespace=None):
        self.calls.append(("validate_update", None))
        if self.fail:
            raise self.fail
        return Validation((), self.warnings)
