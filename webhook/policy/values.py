"""What the policy returns, and the rule table: ids, summaries, vectors, reach."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpu_fence.verdicts import Verdict
from gpu_fence.vocabulary import Visibility
from gpu_fence.warning_text import clip

from ..config import Switch

# --------------------------------------------------------------------------------------------------------------
# What the policy returns


@dataclass(frozen=True)
class Violation:
    """One broken rule (or, among ``Validation.warnings``, one piece of advice). ``container`` is None for pod-level
    rules. ``what`` says what is wrong, naming the container, volume or annotation; ``fix`` the change to the
    workload that clears it; ``way_out``, where the pod looks like trusted infrastructure or the rule guards the
    node, the exemption or upstream setting that removes the need (``webhook.ways_out``)."""

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
        subject = f"container {_quote(self.container)}: " if self.container is not None else ""
        return f"{self.rule}: {subject}{self.fix}"


@dataclass(frozen=True)
class Mutation:
    """RFC 6902 operations to apply to the Pod (``()`` when nothing changes) and the containers they pin."""

    patch: tuple[dict[str, Any], ...]
    pinned: tuple[str, ...]


@dataclass(frozen=True)
class Validation:
    """Violations deny the pod (in ``enforce`` mode); warnings never do. Each warning is a :class:`Violation` too,
    with its rule id: a rule whose switch is at ``warn``, a node rule out of scope (``gpu_node_taints``), or advice
    that is no rule's (:data:`NVIDIA_RUNTIME_CLASS`)."""

    violations: tuple[Violation, ...]
    warnings: tuple[Violation, ...]

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """The distinct rule ids violated, in table order (for audit annotations and metrics)."""
        broken = {violation.rule for violation in self.violations}
        return tuple(rule.id for rule in RULES if rule.id in broken)


class Reach(Enum):
    """What a rule guards, which decides where it applies when ``gpu_node_taints`` scopes the policy."""

    #: A GPU path (the toolkit's variables, mounts and annotations, the allocation itself): judged on every pod. A
    #: rule about the allocation (``bound-gpu-pod``, ``kai-annotation-update``) is one even where the pod could land
    #: on no GPU node: what it guards is that the GPU a container uses is one the scheduler allocated.
    GPU = "gpu"
    #: The node that holds the GPUs: judged only on pods that can land on a GPU node (``webhook.scope``).
    NODE = "node"


@dataclass(frozen=True)
class Rule:
    """One row of the rule table. A rule that guards the node declares ``Reach.NODE``: ``gpu_node_taints`` then
    scopes it, and its violations name the exemption for trusted node agents (``webhook.ways_out``) without code of
    its own; a violation whose ``fix`` is empty is told its way out all the same."""

    id: str
    summary: str
    vectors: tuple[str, ...]
    reach: Reach = Reach.GPU


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


# --------------------------------------------------------------------------------------------------------------
# The rules (docs/policy.md has one section per id, in this order, tested against this table)

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

RULES: tuple[Rule, ...] = (
    Rule(
        UNPINNED_CONTAINER,
        "a container with no device-plugin GPU request is not pinned to NVIDIA_VISIBLE_DEVICES=void or none "
        "(nor each configured alias)",
        ("V1", "V4", "V12", "V16", "V22"),
    ),
    Rule(
        VISIBLE_DEVICES,
        "NVIDIA_VISIBLE_DEVICES (or an alias) set to a GPU on a non-GPU container, set at all on "
        "a GPU container, or set through valueFrom (other than KAI's own reference) or a $(...) reference",
        ("V2", "V3", "V13", "V15"),
    ),
    Rule(
        VISIBLE_DEVICES_NONE,
        "NVIDIA_VISIBLE_DEVICES=none set in the pod, which toolkit 1.18.0-1.18.1 in jit-cdi mode reads as all "
        "(a warning unless visible_devices_none: reject)",
        ("V24",),
    ),
    Rule(
        GPU_ENV_FROM,
        "envFrom on a device-plugin GPU container, which can set NVIDIA_VISIBLE_DEVICES past the allocation "
        "(a warning unless env_from_on_gpu_containers: reject)",
        ("V23",),
    ),
    Rule(PRIVILEGED, "a privileged container sees every device of the node, GPUs included", ("V6",), Reach.NODE),
    Rule(
        SYS_ADMIN_CAPABILITY,
        "capabilities.add with SYS_ADMIN or ALL, which the NVIDIA toolkit treats as privileged",
        ("V7",),
        Reach.NODE,
    ),
    Rule(
        ADDED_CAPABILITY,
        "capabilities.add with a capability not on the allowlist (DAC_READ_SEARCH, SYS_MODULE, SYS_RAWIO, BPF, "
        "PERFMON, SYS_TIME and every other one that reaches the node), or NET_ADMIN or NET_RAW with hostNetwork, or "
        "SYS_PTRACE with shareProcessNamespace",
        ("V18",),
        Reach.NODE,
    ),
    Rule(
        HOST_PID,
        "hostPID: the pod's processes see, signal and inspect every process of the node",
        ("V19",),
        Reach.NODE,
    ),
    Rule(
        DEVICE_LIST_MOUNT,
        "a volumeMount under /var/run/nvidia-container-devices, which the toolkit reads as a device list",
        ("V8",),
    ),
    Rule(
        CDI_ANNOTATION,
        "a pod annotation under cdi.k8s.io/ or nvidia.cdi.k8s.io, which asks for CDI devices",
        ("V9", "V10"),
    ),
    Rule(
        RUNTIME_ANNOTATION,
        "a pod annotation under a forbidden prefix (CRI-O devices, NRI device, CDI device and mount injection)",
        ("V20",),
        Reach.NODE,
    ),
    Rule(
        HOST_DEVICE_PATH,
        "a hostPath volume at or above GPU device nodes, CDI specs, the driver or toolkit, the kubelet, runtime "
        "sockets and storage, /proc or /sys",
        ("V11",),
        Reach.NODE,
    ),
    Rule(
        HOST_PATH,
        "a hostPath volume that is not on the allowlist, or mounted writable where its entry is read-only",
        ("V17",),
        Reach.NODE,
    ),
    Rule(MIG_CONTROL_ENV, "NVIDIA_MIG_CONFIG_DEVICES or NVIDIA_MIG_MONITOR_DEVICES set", ("V14",)),
    Rule(IMEX_CHANNELS, "NVIDIA_IMEX_CHANNELS set in the pod, an IMEX channel request of its own", ("V21",)),
    Rule(
        BOUND_GPU_POD,
        "a pod created with spec.nodeName that has a device-plugin GPU container: it skips the scheduler's resource "
        "fit, and a node that does not advertise the resource runs it with no allocation",
        ("V25",),
    ),
    Rule(
        KAI_ANNOTATION_UPDATE,
        "a pod UPDATE that adds, removes or changes an annotation KAI's binder reads at bind time (the fraction, its "
        "container, the ConfigMap prefix) on a pod KAI schedules",
        ("V26",),
    ),
    Rule(
        GATED_DEVICE_ENV,
        "NVIDIA_NVSWITCH, NVIDIA_GDS, NVIDIA_MOFED or NVIDIA_GDRCOPY set in the pod: requests for node devices "
        "(NVSwitch, GPUDirect Storage, InfiniBand, GDRCopy) that no allocation made",
        ("V27",),
    ),
    Rule(
        VOLUME_TYPE,
        "a volume whose type is not on the allowlist (gitRepo, fc, iscsi, nfs and every other type the kubelet sets up "
        "on the node from what the pod says)",
        ("V28",),
        Reach.NODE,
    ),
    Rule(
        HOST_PROCESS,
        "windowsOptions.hostProcess on the pod or a container: a Windows HostProcess container runs on the node as a "
        "host process",
        ("V29",),
        Reach.NODE,
    ),
    Rule(
        HOST_IPC,
        "hostIPC: the pod joins the node's IPC namespace and gets the node's /dev/shm writable (a warning with "
        "host_ipc: warn)",
        ("V30",),
        Reach.NODE,
    ),
)
#: Rules only a plain pod UPDATE can break (``validate_update``): ``validate`` has no old object to compare with.
UPDATE_RULES = frozenset({KAI_ANNOTATION_UPDATE})

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
PIN_VALUE = "void"
_NAME_LIMIT = 63
# Enum members as module constants: CPython 3.11 looks ``Switch.WARN`` up through the enum's metaclass at every
# access (some 0.4 µs each, measured), and the hot path compares with these several times per review.
_WARN, _REJECT = Switch.WARN, Switch.REJECT
_NONE = Visibility.NONE


def _quote(text: Any) -> str:
    return '"' + clip(text if isinstance(text, str) else repr(text), _NAME_LIMIT) + '"'
