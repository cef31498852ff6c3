"""What the policy returns: the rule ids, a :class:`Violation` of one of them, and the outcome of each entry point
(:class:`Mutation`, :class:`Validation`, :class:`Decision`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, TypedDict

from gpu_fence.verdicts import Verdict
from gpu_fence.warning_text import clip


class RuleId(StrEnum):
    """Every rule's id, in the rule table's order: the order of docs/policy.md's sections (tested), the order in which
    ``validate`` runs the rules, and so the order a denial lists what they find. Each member has exactly one rule
    function, registered beside its code (``webhook.policy.registry``)."""

    UNPINNED_CONTAINER = "unpinned-container"
    VISIBLE_DEVICES = "visible-devices-env"
    VISIBLE_DEVICES_NONE = "visible-devices-none"
    GPU_ENV_FROM = "gpu-env-from"
    PRIVILEGED = "privileged"
    SYS_ADMIN_CAPABILITY = "sys-admin-capability"
    ADDED_CAPABILITY = "added-capability"
    HOST_PID = "host-pid"
    DEVICE_LIST_MOUNT = "device-list-mount"
    CDI_ANNOTATION = "cdi-annotation"
    RUNTIME_ANNOTATION = "runtime-annotation"
    HOST_DEVICE_PATH = "host-device-path"
    HOST_PATH = "host-path"
    MIG_CONTROL_ENV = "mig-control-env"
    IMEX_CHANNELS = "imex-channels-env"
    BOUND_GPU_POD = "bound-gpu-pod"
    KAI_ANNOTATION_UPDATE = "kai-annotation-update"
    GATED_DEVICE_ENV = "gated-device-env"
    VOLUME_TYPE = "volume-type"
    HOST_PROCESS = "host-process"
    HOST_IPC = "host-ipc"


#: The id of the one warning that is no rule's: an NVIDIA runtime class on a pod with no GPU container (V5), which
#: the pin neutralises.
NVIDIA_RUNTIME_CLASS = "nvidia-runtime-class"

#: How much of a name (a container's, a volume's, an annotation key) a message quotes.
NAME_LIMIT = 63


def quote(text: Any) -> str:
    """A name as messages show it: in double quotes, clipped; what is no string (the pod author's JSON) as its repr."""
    return '"' + clip(text if isinstance(text, str) else repr(text), NAME_LIMIT) + '"'


@dataclass(frozen=True)
class Violation:
    """One broken rule (or, among ``Validation.warnings``, one piece of advice). ``rule`` is a :class:`RuleId` (or
    :data:`NVIDIA_RUNTIME_CLASS`); ``container`` is None for pod-level rules. ``what`` says what is wrong, naming the
    container, volume or annotation; ``fix`` the change to the workload that clears it; ``way_out``, where the pod
    looks like trusted infrastructure or the rule guards the node, the exemption or upstream setting that removes
    the need (``webhook.ways_out``)."""

    rule: str
    container: str | None
    what: str
    fix: str = ""
    way_out: str = ""

    @property
    def detail(self) -> str:
        """What is wrong, the fix and the way out, in one line without the rule id (what the check reports)."""
        return "; ".join(part for part in (self.what, self.fix, self.way_out) if part)

    @property
    def message(self) -> str:
        """The violation in one line, led by its rule id so that people and log searches find it: what denials
        and every report of the check say."""
        return f"{self.rule}: {self.detail}"

    @property
    def finding(self) -> str:
        """The message without the way out: a denial says each way out once, however many violations share it."""
        return f"{self.rule}: " + "; ".join(part for part in (self.what, self.fix) if part)

    @property
    def advice(self) -> str:
        """The violation as a warning reads it, led by the rule id and the fix (warnings are short, and the fix is
        what a reader acts on): ``rule: container "x": fix``; where there is no fix of the workload's own (the way
        out replaces it, and the envelope says each way out once), the finding."""
        if not self.fix:
            return self.finding
        subject = f"container {quote(self.container)}: " if self.container is not None else ""
        return f"{self.rule}: {subject}{self.fix}"


class AddOperation(TypedDict):
    """The one RFC 6902 operation ``mutate`` emits (``webhook.policy.patch``)."""

    op: Literal["add"]
    path: str
    value: Any


@dataclass(frozen=True)
class Mutation:
    """RFC 6902 operations to apply to the Pod (``()`` when nothing changes) and the containers they pin."""

    patch: tuple[AddOperation, ...]
    pinned: tuple[str, ...]


@dataclass(frozen=True)
class Validation:
    """Violations deny the pod (in ``enforce`` mode); warnings never do. Each warning is a :class:`Violation` too,
    with its rule id: a rule whose switch is at ``warn``, a node rule out of scope (``gpu_node_taints``), or advice
    that is no rule's (:data:`NVIDIA_RUNTIME_CLASS`)."""

    violations: tuple[Violation, ...]
    warnings: tuple[Violation, ...]

    @property
    def rule_ids(self) -> tuple[RuleId, ...]:
        """The distinct rule ids violated, in table order (for audit annotations and metrics)."""
        broken = {violation.rule for violation in self.violations}
        return tuple(rule for rule in RuleId if rule in broken)


NO_MUTATION = Mutation(patch=(), pinned=())
NO_VIOLATIONS = Validation(violations=(), warnings=())


@dataclass(frozen=True)
class Decision:
    """The whole admission outcome for one pod: exemption, then mutation, then validation of the mutated pod."""

    exempt: str | None
    mutation: Mutation
    validation: Validation

    @property
    def verdict(self) -> Verdict:
        if self.exempt is not None:
            return Verdict.EXEMPT
        if self.validation.violations:
            return Verdict.REJECTED
        if self.mutation.patch:
            return Verdict.MUTATED
        return Verdict.ALLOWED
