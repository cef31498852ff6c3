"""The admission policy: pin ``NVIDIA_VISIBLE_DEVICES=void`` on containers with no GPU, reject other GPU paths.

Pure functions over the Pod as a plain dict (as JSON-decoded from the AdmissionReview or read from YAML). They
never raise on malformed input and never modify it: what cannot be read is treated conservatively (a container
whose ``env`` is not a list cannot be pinned, so it is a violation) and a decision is always returned.

Reading order: the values returned, the rule table, how a pod is read, one function per rule (named after its
rule id), then ``mutate``, ``validate``, ``validate_update`` (a plain pod UPDATE), ``exemption`` and ``evaluate``,
which chains them as the offline check does. The GPU vocabulary (what is a GPU request, what a
``NVIDIA_VISIBLE_DEVICES`` value means) lives in ``gpu_fence.vocabulary``, KAI's names in ``gpu_fence.kai``, host
path matching in ``webhook.host_paths``; the rule ids and their vectors are those of ``docs/policy.md`` and
``docs/threat-model.md``.

Who gets pinned: every container that requests no device-plugin GPU resource. A DRA claim does not spare a
container the pin (the claim may be for any device class, and NVIDIA's CDI specs set ``void`` themselves), and
neither does being KAI's fraction container (KAI's webhook replaces the pin with its ConfigMap reference).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, NamedTuple

from gpu_fence import kai
from gpu_fence.verdicts import Verdict
from gpu_fence.vocabulary import (
    CONTAINER_FIELDS,
    DEVICE_LIST_MOUNT_PREFIXES,
    GATED_DEVICE_ENVS,
    IMEX_CHANNELS_ENV,
    MIG_CONTROL_ENVS,
    VISIBLE_DEVICES_ENV,
    Visibility,
    has_resource_claims,
    kai_fraction_container,
    parse_visible_devices,
    requests_device_plugin_gpu,
)
from gpu_fence.warning_text import clip

from .config import (
    CDI_ANNOTATION_PREFIXES,
    HOST_PATH_VOLUME,
    SHARED_NAMESPACE_CAPABILITIES,
    SYS_ADMIN_CAPABILITIES,
    PolicyConfig,
    SharedNamespace,
    Switch,
    capability_name,
)
from .host_paths import clean_path, reaches_protected
from .scope import reaches_gpu_nodes
from .ways_out import way_out

__all__ = [
    "CDI_ANNOTATION_PREFIXES",
    "NVIDIA_RUNTIME_CLASS",
    "RULES",
    "Decision",
    "Mutation",
    "Reach",
    "Rule",
    "Validation",
    "Violation",
    "apply_patch",
    "clean_path",
    "evaluate",
    "exemption",
    "mutate",
    "validate",
    "validate_update",
]

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

# --------------------------------------------------------------------------------------------------------------
# Reading a pod


class _Container(NamedTuple):
    field: str
    index: int
    name: str  # the container's name, or "field[index]" when it has none
    body: Mapping[str, Any]
    #: A device-plugin GPU request: the plugin sets NVIDIA_VISIBLE_DEVICES from the allocation, so the container is
    #: not pinned and must not set the variable (nor an alias) itself.
    gpu: bool
    #: KAI's fraction container of a pod that KAI binds: pinned to void like the others (KAI's webhook replaces the
    #: pin with its reference), aliases left alone (one would override KAI's value), KAI's reference accepted.
    kai_fraction: bool
    claims: bool  # lists DRA claims: pinned all the same (see the module docstring), but counts as getting a device
    #: ``(name, entry)`` for each readable env entry whose name a rule reads (``NVIDIA_VISIBLE_DEVICES``, its
    #: configured aliases, the MIG and IMEX variables; see :func:`_watched_env_names`); the others (most of a
    #: typical env) no rule looks at, so they are dropped once here instead of skipped by every rule. Duplicates
    #: are all kept: the kubelet keeps the last, but every one of them is judged, so no ordering trick can hide a
    #: value.
    env: list[tuple[str, Mapping[str, Any]]]
    env_readable: bool  # False when ``env`` is present but not a list: nothing can be appended to it
    pins: tuple[str, ...]  # the env names the container must carry (pinned to void by ``mutate``), in pin order


class _Pod(NamedTuple):
    """What every rule reads, computed once per call (the hot path reads each container once)."""

    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    containers: tuple[_Container, ...]  # the containers under judgement (only the selected ones with ``only``)
    unreadable: tuple[Violation, ...]  # container lists or entries that are not what the API allows
    config: PolicyConfig
    whole_pod: bool  # False when judging only some ephemeral containers: pod-level rules were judged at CREATE
    #: What two rules read alike (the capabilities added, the hostPath volumes), worked out once by the first.
    memo: dict[str, Any]


def _mapping(value: Any) -> Mapping[str, Any]:
    # JSON and YAML decoders produce dicts; testing the concrete type keeps the hot path off the ABC machinery.
    return value if isinstance(value, dict) else _EMPTY


_EMPTY: Mapping[str, Any] = {}


def _quote(text: Any) -> str:
    return '"' + clip(text if isinstance(text, str) else repr(text), _NAME_LIMIT) + '"'


def _in_container(rule: str, container: _Container, what: str, fix: str) -> Violation:
    """A violation by one container: what is wrong names the container first, quoted and clipped, as people read
    it."""
    return Violation(rule, container.name, f"container {_quote(container.name)} {what}", fix)


def _kai_fraction_name(pod: Mapping[str, Any], config: PolicyConfig) -> str | None:
    """KAI's fraction container, when the fraction annotations can be trusted: under a configured KAI scheduler
    and with no ``spec.nodeName`` at creation. A pod created bound to a node never meets KAI's scheduler or binder,
    so nothing would ever fill the ConfigMap its reference names, and the pod author's own ConfigMap of that name
    would be read instead."""
    spec = _mapping(pod.get("spec"))
    # The scheduler first: nearly every pod names another (or none), and this runs for every pod admitted. Anything
    # but a string could not name a scheduler anyway (and is not hashable).
    scheduler = spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return None
    node = spec.get("nodeName")
    if node is not None and node != "":  # _bound_at_creation, inline: once per pod admitted
        return None
    return kai_fraction_container(pod, config.kai_scheduler_set)


def _bound_at_creation(spec: Mapping[str, Any]) -> bool:
    node = spec.get("nodeName")
    return node is not None and node != ""


def _read_pod(pod: Any, config: PolicyConfig, only: Collection[str] | None) -> _Pod:
    # The hot path of every review: JSON input, so concrete ``dict``/``list`` checks (not the ``Mapping`` ABC), and
    # no text is formatted unless something is wrong.
    if not isinstance(pod, dict):
        problem = Violation(
            UNPINNED_CONTAINER,
            None,
            "the object is not a Pod (not a JSON object), so no container can be pinned",
            "submit a Pod manifest",
        )
        return _Pod({}, {}, (), (problem,), config, only is None, {})
    spec = pod.get("spec")
    unreadable: list[Violation] = []
    if not isinstance(spec, dict):
        unreadable.append(
            Violation(
                UNPINNED_CONTAINER,
                None,
                "the pod has no readable spec, so no container can be pinned",
                "give the Pod a spec object",
            )
        )
        spec = {}
    kai_name = _kai_fraction_name(pod, config)
    watched = _watched_env_names(config)
    resources = config.gpu_resource_set
    pin_names = config.pin_names
    fields = CONTAINER_FIELDS if only is None else ("ephemeralContainers",)
    containers: list[_Container] = []
    for field in fields:
        entries = spec.get(field)
        if entries is None:
            continue
        if not isinstance(entries, list):
            unreadable.append(
                Violation(
                    UNPINNED_CONTAINER,
                    None,
                    f"spec.{field} is not a list, so its containers cannot be pinned",
                    f"make spec.{field} a list of containers",
                )
            )
            continue
        ephemeral = field == "ephemeralContainers"
        for index, body in enumerate(entries):
            if not isinstance(body, dict):
                label = f"{field}[{index}]"
                unreadable.append(
                    Violation(
                        UNPINNED_CONTAINER,
                        label,
                        f"spec.{label} is not an object, so it cannot be pinned",
                        "make it a container object",
                    )
                )
                continue
            name = body.get("name")
            named = isinstance(name, str)
            if only is not None and (not named or name not in only):
                continue
            # Ephemeral containers can hold no resources and are never KAI's fraction container. Claims matter only
            # on a container that is not the device plugin's (where they decide a message and a warning).
            if ephemeral:
                gpu = fraction = claims = False
                pins = pin_names
            elif requests_device_plugin_gpu(body, resources):
                gpu, fraction, claims = True, False, False
                pins = ()
            else:
                gpu = False
                fraction = kai_name is not None and name == kai_name
                claims = "claims" in _mapping(body.get("resources")) and has_resource_claims(body)
                pins = _KAI_PINS if fraction else pin_names
            env = body.get("env")
            if isinstance(env, list):
                readable, watched_env = True, _watched_env(env, watched)
            else:
                readable, watched_env = env is None, []
            containers.append(
                _Container(
                    field,
                    index,
                    name if named and name else f"{field}[{index}]",
                    body,
                    gpu,
                    fraction,
                    claims,
                    watched_env,
                    readable,
                    pins,
                )
            )
    return _Pod(_mapping(pod.get("metadata")), spec, tuple(containers), tuple(unreadable), config, only is None, {})


_KAI_PINS = (VISIBLE_DEVICES_ENV,)


def _watched_env_names(config: PolicyConfig) -> frozenset[str]:
    """Every env name some rule reads: the visible-devices names (``NVIDIA_VISIBLE_DEVICES`` and the configured
    aliases), the MIG control variables, the IMEX channels and the gated device requests. A rule that reads another
    env name must be added here."""
    return config.visible_devices_names | _OTHER_WATCHED_NAMES


_MIG_CONTROL_NAMES = frozenset(MIG_CONTROL_ENVS)
_OTHER_WATCHED_NAMES = _MIG_CONTROL_NAMES | {IMEX_CHANNELS_ENV} | GATED_DEVICE_ENVS.keys()


def _watched_env(env: list[Any], watched: frozenset[str]) -> list[tuple[str, Mapping[str, Any]]]:
    # The usual env, every entry an object with a name, in one comprehension: any other JSON value fails the
    # subscript, and a name found in ``watched`` (strings only) is a string. An entry that is no object, has no
    # name or an unhashable one raises, and the whole list takes the careful loop instead.
    try:
        return [(entry["name"], entry) for entry in env if entry["name"] in watched]
    except (TypeError, KeyError):
        pass
    found: list[tuple[str, Mapping[str, Any]]] = []
    for entry in env:
        if isinstance(entry, dict):
            name = entry.get("name")
            if isinstance(name, str) and name in watched:  # the str test first: a list name is unhashable
                found.append((name, entry))
    return found


def _missing_pins(container: _Container) -> tuple[str, ...]:
    """The pin names the container has no env entry for (whatever the entries' values: validation judges them).

    A loop and no new object in the usual case (one pin, present, found after one or two entries): this runs for
    every container admitted."""
    pins = container.pins
    if len(pins) == 1:
        pin = pins[0]
        for name, _ in container.env:
            if name == pin:
                return ()
        return pins
    present = {name for name, _ in container.env}
    return tuple(pin for pin in pins if pin not in present)


# --------------------------------------------------------------------------------------------------------------
# KAI's reference (kai-scheduler/KAI-Scheduler d5bc503a: pkg/binder/common/gpu_access.go AddGPUSharingEnvVars,
# env_vars.go AddDirectEnvVarsConfigMapSource, gpusharingconfigmap/config_map.go)


def _kai_config_map_prefix(pod: _Pod) -> str | None:
    prefix = _mapping(pod.metadata.get("annotations")).get(kai.SHARED_GPU_CONFIG_MAP_ANNOTATION)
    if isinstance(prefix, str) and kai.SHARED_GPU_CONFIG_MAP_PREFIX.fullmatch(prefix):
        return prefix
    return None


def _is_kai_reference(pod: _Pod, container: _Container, entry: Mapping[str, Any]) -> bool:
    """The one ``valueFrom`` allowed: on KAI's fraction container, exactly the required ``configMapKeyRef`` that
    KAI's webhook writes, to the ConfigMap its binder fills for this container (named after the pod's prefix
    annotation and the container's place). Any other ConfigMap would be one the pod author filled."""
    value_from = entry.get("valueFrom")
    if entry.get("value") not in (None, "") or not isinstance(value_from, dict):
        return False
    if list(value_from) != ["configMapKeyRef"]:
        return False
    reference = value_from["configMapKeyRef"]
    prefix = _kai_config_map_prefix(pod)
    return (
        isinstance(reference, dict)
        and prefix is not None
        and reference.get("name") == _kai_config_map(prefix, container)
        and reference.get("key") == VISIBLE_DEVICES_ENV
        and reference.get("optional") in (None, False)
    )


def _kai_config_map(prefix: str, container: _Container) -> str:
    return kai.capabilities_config_map(prefix, init=container.field == "initContainers", index=container.index)


def _is_kai_env_source(pod: _Pod, container: _Container, source: Any) -> bool:
    """KAI's own ``envFrom`` on its fraction container: its ``-evar`` ConfigMap, required."""
    prefix = _kai_config_map_prefix(pod)
    if prefix is None or not isinstance(source, dict) or list(source) != ["configMapRef"]:
        return False
    reference = source["configMapRef"]
    expected = kai.direct_env_config_map(prefix, init=container.field == "initContainers", index=container.index)
    return (
        isinstance(reference, dict) and reference.get("name") == expected and reference.get("optional") in (None, False)
    )


def _kai_value_from_problem(pod: _Pod, container: _Container, name: str) -> str | None:
    """Why a ``valueFrom`` that looks like KAI's is not accepted, when the pod asks for a KAI fraction."""
    annotations = _mapping(pod.metadata.get("annotations"))
    if name != VISIBLE_DEVICES_ENV or not any(key in annotations for key in kai.FRACTION_ANNOTATIONS):
        return None
    scheduler = pod.spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in pod.config.kai_scheduler_set:
        return None
    if _bound_at_creation(pod.spec):
        return (
            f"sets {name} through valueFrom on a KAI fraction pod created with spec.nodeName, which no KAI "
            "scheduler or binder ever sees, so the ConfigMap is the pod author's"
        )
    if container.kai_fraction:
        return f"sets {name} through valueFrom, but not as KAI's reference to the ConfigMap KAI fills for it"
    return None


# --------------------------------------------------------------------------------------------------------------
# One function per rule. Each takes the read pod and returns its violations.


def unpinned_container(pod: _Pod) -> list[Violation]:
    found = list(pod.unreadable)  # what cannot be read cannot be pinned
    for container in pod.containers:
        if not container.pins:  # a GPU container
            continue
        if not container.env_readable:
            found.append(
                _in_container(
                    UNPINNED_CONTAINER,
                    container,
                    f"has an env that is not a list, so {VISIBLE_DEVICES_ENV}=void cannot be pinned",
                    "make env a list of name/value",
                )
            )
            continue
        pins = container.pins
        if len(pins) == 1:  # _missing_pins inline for the usual single pin: this runs for every container
            pin = pins[0]
            for name, _ in container.env:
                if name == pin:
                    break
            else:
                found.append(_in_container(UNPINNED_CONTAINER, container, *_unpinned_detail(container, pin)))
            continue
        missing = _missing_pins(container)
        if missing:
            found.append(_in_container(UNPINNED_CONTAINER, container, *_unpinned_detail(container, missing[0])))
    return found


def _unpinned_detail(container: _Container, name: str) -> tuple[str, str]:
    if container.kai_fraction:
        why = "is KAI's fraction container and does not set"
    elif container.claims:
        why = "has DRA claims but no device-plugin GPU request, and does not set"
    else:
        why = "requests no GPU and does not set"
    alias = "" if name == VISIBLE_DEVICES_ENV else f" (read by the toolkit instead of {VISIBLE_DEVICES_ENV})"
    return f"{why} {name}{alias}", f"add env {name}=void (or request nvidia.com/gpu)"


def visible_devices_env(pod: _Pod) -> list[Violation]:
    names = pod.config.visible_devices_names
    found: list[Violation] = []
    nones: list[tuple[_Container, str]] = _NO_NONES  # accepted values the toolkit reads as none (_none_settings)
    for container in pod.containers:
        for name, entry in container.env:
            if name not in names:
                continue
            value = entry.get("value")
            if entry.get("valueFrom") is not None:
                if container.kai_fraction and name == VISIBLE_DEVICES_ENV and _is_kai_reference(pod, container, entry):
                    continue
                problem = _kai_value_from_problem(pod, container, name) or (
                    f"sets {name} through valueFrom, which cannot be checked"
                )
            elif value is not None and not isinstance(value, str):
                problem = f"sets {name} to a non-string value"
            elif value is not None and "$(" in value:
                problem = f"sets {name} with a $(...) reference, which cannot be checked"
            elif container.gpu:
                problem = (
                    f"requests a GPU and also sets {name}={_quote(value or '')}, which competes with the allocation"
                )
            elif container.kai_fraction and name != VISIBLE_DEVICES_ENV:
                problem = f"is KAI's fraction container and sets {name}, which the toolkit reads instead of KAI's value"
            elif (parsed := parse_visible_devices(value or "")).grants_no_gpu:
                if parsed.visibility is _NONE:
                    nones = [*nones, (container, name)]
                continue
            else:
                problem = f"sets {name}={_quote(value)} but requests no GPU"
            fix = (
                f"remove {name} (the device plugin sets it from the allocation)"
                if container.gpu
                else f"request nvidia.com/gpu, or remove {name}"
            )
            found.append(_in_container(VISIBLE_DEVICES, container, problem, fix))
    pod.memo["none"] = nones
    return found


_NO_NONES: list[tuple[_Container, str]] = []  # shared, never appended to: the usual answer


def _none_settings(pod: _Pod) -> list[tuple[_Container, str]]:
    """Each ``(container, name)`` where the pod itself sets a visible-devices variable to a value the toolkit reads
    as ``none``, among the values ``visible-devices-env`` accepts (a GPU container's value, an alias on KAI's
    fraction container, a reference are that rule's). That rule finds them as it judges each value, so within
    ``validate`` they are read from its pass; alone, the same pass is made here."""
    nones = pod.memo.get("none")
    if nones is None:
        visible_devices_env(pod)
        nones = pod.memo["none"]
    return nones


def visible_devices_none(pod: _Pod) -> list[Violation]:
    if pod.config.visible_devices_none is not _REJECT:
        return []
    return [
        _in_container(
            VISIBLE_DEVICES_NONE,
            container,
            f"sets {name} to none, which NVIDIA container toolkit 1.18.0 and 1.18.1 read as all in jit-cdi mode "
            "(fixed in 1.18.2)",
            f"set {name}=void",
        )
        for container, name in _none_settings(pod)
    ]


def _env_from_gaps(pod: _Pod) -> list[_Container]:
    """Containers whose ``envFrom`` may set a visible-devices variable that no explicit entry overrides.

    An explicit ``env`` entry wins over ``envFrom`` (kubelet ``makeEnvironmentVariables``), so a pinned container is
    safe whatever its ``envFrom`` holds. A device-plugin GPU container has no such entry (the plugin's value is
    the one that counts, and a pod value would beat it); KAI's fraction container has KAI's entry, but none for a
    configured alias."""
    aliases = pod.config.visible_devices_aliases
    gaps: list[_Container] = []
    for container in pod.containers:
        sources = container.body.get("envFrom")
        if not sources:  # absent, null or empty, as nearly always
            continue
        if container.gpu or (
            container.kai_fraction
            and aliases
            and (not isinstance(sources, list) or not all(_is_kai_env_source(pod, container, s) for s in sources))
        ):
            gaps.append(container)
    return gaps


def gpu_env_from(pod: _Pod) -> list[Violation]:
    if pod.config.env_from_on_gpu_containers is not _REJECT:
        return []
    return [
        _in_container(
            GPU_ENV_FROM,
            container,
            f"gets a GPU and uses envFrom, which can set {VISIBLE_DEVICES_ENV} (or an alias) past the allocation",
            "set the variables with env instead of envFrom",
        )
        for container in _env_from_gaps(pod)
    ]


def privileged(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    additions: list[tuple[_Container, list[str]]] = []  # for the capability rules, read in the same pass
    host_processes: list[_Container] = _NO_CONTAINERS  # for host-process, likewise
    for container in pod.containers:
        security = container.body.get("securityContext")
        if not isinstance(security, dict):
            continue
        flag = security.get("privileged")
        if flag is True or (isinstance(flag, str) and flag.lower() == "true"):
            found.append(
                _in_container(
                    PRIVILEGED,
                    container,
                    "is privileged and sees every device of the node, GPUs included",
                    "remove securityContext.privileged and add only the capabilities it needs (allowed_capabilities); "
                    "request nvidia.com/gpu for a GPU",
                )
            )
        capabilities = security.get("capabilities")
        if capabilities:
            added = _mapping(capabilities).get("add")
            if isinstance(added, list) and added:
                additions.append((container, [name for name in added if isinstance(name, str)]))
        options = security.get("windowsOptions")
        if options and _mapping(options).get("hostProcess") is True:
            host_processes = [*host_processes, container]
    pod.memo["capabilities"] = additions
    pod.memo["host process"] = host_processes
    return found


_NO_CONTAINERS: list[_Container] = []  # shared, never appended to: the usual answer


def _capability_additions(pod: _Pod) -> list[tuple[_Container, list[str]]]:
    """Each container that adds capabilities, with the names it adds (strings only). ``privileged`` reads them
    as it reads each security context, so within ``validate`` they come from its pass; alone, it is made here."""
    additions = pod.memo.get("capabilities")
    if additions is None:
        privileged(pod)
        additions = pod.memo["capabilities"]
    return additions


def sys_admin_capability(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    for container, added in _capability_additions(pod):
        # Runtimes upper-case names and add the CAP_ prefix themselves, so "cap_sys_admin" is SYS_ADMIN too.
        for capability in added:
            if capability_name(capability) in SYS_ADMIN_CAPABILITIES:
                found.append(
                    _in_container(
                        SYS_ADMIN_CAPABILITY,
                        container,
                        f"adds capability {_quote(capability)}, which the NVIDIA toolkit treats as privileged",
                        f"remove {_quote(capability)} from securityContext.capabilities.add",
                    )
                )
                break
    return found


def added_capability(pod: _Pod) -> list[Violation]:
    """Every added capability must be on the allowlist; and those that reach past the pod once it shares a namespace
    (``SHARED_NAMESPACE_CAPABILITIES``) must not meet that namespace."""
    allowed = pod.config.allowed_capability_set
    found: list[Violation] = []
    for container, added in _capability_additions(pod):
        names = [(capability, capability_name(capability)) for capability in added]
        unlisted = [raw for raw, name in names if name not in allowed and name not in SYS_ADMIN_CAPABILITIES]
        groups = [
            (unlisted, ", which reaches the node or other pods and is not on the allowlist (allowed_capabilities)", "")
        ]
        for shared in _shared_namespaces(pod, container):
            reaching = [raw for raw, name in names if name in allowed and name in SHARED_NAMESPACE_CAPABILITIES[shared]]
            groups.append((reaching, f" and shares {_SHARED_WHAT[shared]}, which it then reaches", _SHARED_FIX[shared]))
        for listed, why, unshare in groups:
            if listed:
                quoted = ", ".join(_quote(c) for c in listed)
                fix = f"remove {quoted} from securityContext.capabilities.add" + (f", or {unshare}" if unshare else "")
                found.append(_in_container(ADDED_CAPABILITY, container, f"adds capability {quoted}{why}", fix))
    return found


#: What each shared namespace hands a capability, and how a pod stops sharing it.
_SHARED_WHAT = {
    SharedNamespace.HOST_NETWORK: "the node's network namespace (hostNetwork)",
    SharedNamespace.SHARE_PROCESS_NAMESPACE: "a PID namespace with a container that gets a GPU",
}
_SHARED_FIX = {
    SharedNamespace.HOST_NETWORK: "drop hostNetwork",
    SharedNamespace.SHARE_PROCESS_NAMESPACE: "stop sharing the process namespace (shareProcessNamespace, or the "
    "debug container's targetContainerName); with kubectl debug, --profile=baseline adds no SYS_PTRACE (the default "
    "profile, general, does)",
}


def _flag(value: Any) -> bool:
    """A boolean field as the API reads it (a YAML manifest may hold the string)."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _shared_namespaces(pod: _Pod, container: _Container) -> list[SharedNamespace]:
    """The namespaces this container shares in which :data:`SHARED_NAMESPACE_CAPABILITIES` reach further: the
    node's network, and a PID namespace that holds another container that gets a GPU (the pod's, with
    ``shareProcessNamespace``; for a debug container, its target's, with ``targetContainerName``). Read only for a
    container that adds capabilities."""
    shared: list[SharedNamespace] = []
    spec = pod.spec
    if _flag(spec.get("hostNetwork")):
        shared.append(SharedNamespace.HOST_NETWORK)
    target = container.body.get("targetContainerName") if container.field == "ephemeralContainers" else None
    if target:
        sharers: Collection[Any] = (target,)
    elif _flag(spec.get("shareProcessNamespace")):
        sharers = [body.get("name") for body in _spec_containers(spec) if body.get("name") != container.name]
    else:
        sharers = ()
    if sharers and any(_gets_gpu(pod, name) for name in sharers):
        shared.append(SharedNamespace.SHARE_PROCESS_NAMESPACE)
    return shared


def _spec_containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The init and regular containers of the spec (ephemeral ones never get a GPU), as far as they can be read."""
    for field in ("initContainers", "containers"):
        entries = spec.get(field)
        if isinstance(entries, list):
            yield from (body for body in entries if isinstance(body, dict))


def _gets_gpu(pod: _Pod, name: Any) -> bool:
    """Whether the spec's container of that name gets a GPU: a device-plugin request, a DRA claim (of any class:
    counted, to be safe) or KAI's fraction. A name that names no readable container counts too (fail closed)."""
    bodies = [body for body in _spec_containers(pod.spec) if body.get("name") == name]
    if not bodies or not isinstance(name, str):
        return True
    kai_name = _kai_fraction_name({"metadata": pod.metadata, "spec": pod.spec}, pod.config)
    return any(
        requests_device_plugin_gpu(body, pod.config.gpu_resource_set) or has_resource_claims(body) or name == kai_name
        for body in bodies
    )


def host_pid(pod: _Pod) -> list[Violation]:
    if not pod.whole_pod:  # immutable: judged when the pod was created
        return []
    if _flag(pod.spec.get("hostPID")):
        return [
            Violation(
                HOST_PID,
                None,
                "the pod shares the node's PID namespace (hostPID), where its processes see, signal and inspect "
                "(environment, files) other pods' processes, GPU jobs included",
                "remove hostPID",
            )
        ]
    return []


def _volume_mounts(container: _Container) -> Iterator[Mapping[str, Any]]:
    mounts = container.body.get("volumeMounts")
    if isinstance(mounts, list):
        yield from (mount for mount in mounts if isinstance(mount, dict))


def _is_device_list_path(cleaned: str) -> bool:
    """The toolkit's test is lexical: the cleaned destination starts with the marker, with no "/" boundary, so
    ".../nvidia-container-devicesall" means "all". The marker deeper in a path is flagged too, as defence in
    depth: ``/var/run/../var/run/nvidia-container-devices/0`` cleans to ``/var/var/run/...``, which today's
    toolkit ignores, yet no legitimate workload mounts anything under that name."""
    return cleaned.startswith(DEVICE_LIST_MOUNT_PREFIXES) or _DEVICE_LIST_COMPONENT in cleaned


#: Every path :func:`_is_device_list_path` accepts contains this (the prefixes' last component). Cleaning drops
#: ``.``, ``..`` and empty components but never changes the text of a component, and the marker holds no ``/``, so a
#: cleaned path can contain it only if the raw path does: testing the raw path first skips the clean for all
#: ordinary mounts.
_DEVICE_LIST_MARKER = DEVICE_LIST_MOUNT_PREFIXES[0].rsplit("/", 1)[-1]
_DEVICE_LIST_COMPONENT = "/" + _DEVICE_LIST_MARKER


def device_list_mount(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    for container in pod.containers:
        mounts = container.body.get("volumeMounts")
        if not isinstance(mounts, list):
            continue
        for mount in mounts:
            if not isinstance(mount, dict):
                continue
            path = mount.get("mountPath")
            if isinstance(path, str) and _DEVICE_LIST_MARKER in path and _is_device_list_path(clean_path(path)):
                found.append(
                    _in_container(
                        DEVICE_LIST_MOUNT,
                        container,
                        f"mounts a volume at {_quote(path)}, which the NVIDIA toolkit reads as a GPU request",
                        f"remove the volumeMount at {_quote(path)} and request nvidia.com/gpu",
                    )
                )
    return found


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


def _other_volumes(pod: _Pod) -> list[dict[str, Any]]:
    """The volumes that have a key but ``name`` and the allowed volume types: hostPath volumes (never an allowed
    type) and those ``volume-type`` rejects. One pass over the volumes for the three rules that read them; nearly
    every pod has none."""
    others = pod.memo.get("other volumes")
    if others is None:
        volumes = pod.spec.get("volumes")
        allowed = pod.config.allowed_volume_keys
        others = (
            [v for v in volumes if isinstance(v, dict) and not v.keys() <= allowed] if isinstance(volumes, list) else []
        )
        pod.memo["other volumes"] = others
    return others


def _host_path_volumes(pod: _Pod) -> list[tuple[Any, str, str, str | None]]:
    """``(name, path, cleaned path, the protected path it reaches or None)`` of each hostPath volume under
    judgement: all of them, or with ``only`` those the new ephemeral containers mount (the rest were judged when
    the pod was created). Read once per pod: two rules share it."""
    found = pod.memo.get("host paths")
    if found is not None:
        return found
    found = []
    hosts = [volume for volume in _other_volumes(pod) if "hostPath" in volume]
    if hosts:
        mounted: set[str] | None = None
        if not pod.whole_pod:
            mounted = {m["name"] for c in pod.containers for m in _volume_mounts(c) if isinstance(m.get("name"), str)}
        for volume in hosts:
            path = _mapping(volume.get("hostPath")).get("path")
            name = volume.get("name")
            if not isinstance(path, str) or (
                mounted is not None and (not isinstance(name, str) or name not in mounted)
            ):
                continue
            cleaned = clean_path(path)
            reached = next((p for p in pod.config.host_device_paths if reaches_protected(cleaned, p)), None)
            found.append((name, path, cleaned, reached))
    pod.memo["host paths"] = found
    return found


def host_device_path(pod: _Pod) -> list[Violation]:
    return [
        Violation(
            HOST_DEVICE_PATH,
            None,
            f"volume {_quote(name)} mounts host path {_quote(path)}, which exposes {reached}",
            f"replace hostPath volume {_quote(name)} with another volume type (request nvidia.com/gpu for a GPU)",
        )
        for name, path, _, reached in _host_path_volumes(pod)
        if reached is not None
    ]


def _writable_volumes(pod: _Pod) -> set[str]:
    """Names of the volumes that a container under judgement mounts without ``readOnly: true``."""
    return {
        mount["name"]
        for container in pod.containers
        for mount in _volume_mounts(container)
        if isinstance(mount.get("name"), str) and mount.get("readOnly") is not True
    }


def host_path(pod: _Pod) -> list[Violation]:
    """Every hostPath that ``host-device-path`` does not already reject must be on the allowlist, exactly (its
    sub-paths are not: see docs/policy.md), and mounted read-only unless its entry allows writes."""
    allowlist = pod.config.host_path_writable
    found: list[Violation] = []
    writable: set[str] | None = None
    for name, path, cleaned, reached in _host_path_volumes(pod):
        if reached is not None:  # host-device-path's
            continue
        allowed = allowlist.get(cleaned)
        if allowed is None:
            found.append(
                Violation(
                    HOST_PATH,
                    None,
                    f"volume {_quote(name)} mounts host path {_quote(path)}, which is not on the hostPath "
                    "allowlist (host_path_allowlist)",
                    f"replace hostPath volume {_quote(name)} with another volume type, or ask for an allowlist entry",
                )
            )
            continue
        if allowed:
            continue
        if writable is None:
            writable = _writable_volumes(pod)
        if name in writable:
            found.append(
                Violation(
                    HOST_PATH,
                    None,
                    f"volume {_quote(name)} mounts host path {_quote(path)} writable, which the hostPath allowlist "
                    "allows read-only",
                    f"set readOnly: true on every volumeMount of volume {_quote(name)}",
                )
            )
    return found


def _device_variables(pod: _Pod) -> list[tuple[_Container, str]]:
    """Each ``(container, name)`` that sets a MIG, IMEX or gated device variable: found in one pass over the
    watched env by the first of the three rules that read them; the others read that pass."""
    settings = pod.memo.get("device variables")
    if settings is None:
        settings = [
            (container, name)
            for container in pod.containers
            for name, _ in container.env
            if name in _OTHER_WATCHED_NAMES
        ]
        pod.memo["device variables"] = settings
    return settings


def _env_variable_violations(pod: _Pod, rule: str, names: Collection[str], why: str) -> list[Violation]:
    settings = _device_variables(pod)
    if not settings:
        return []
    return [
        _in_container(rule, container, f"sets {name}, {why}", f"remove {name}")
        for container, name in settings
        if name in names
    ]


def mig_control_env(pod: _Pod) -> list[Violation]:
    return _env_variable_violations(pod, MIG_CONTROL_ENV, _MIG_CONTROL_NAMES, "which controls MIG on the whole GPU")


def imex_channels_env(pod: _Pod) -> list[Violation]:
    return _env_variable_violations(
        pod,
        IMEX_CHANNELS,
        (IMEX_CHANNELS_ENV,),
        "an IMEX channel request that no allocation made (the device plugin or DRA driver sets it)",
    )


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


def gated_device_env(pod: _Pod) -> list[Violation]:
    settings = pod.memo.get("device variables")  # the memo first: within validate, the MIG rule's pass
    if settings is None:
        settings = _device_variables(pod)
    if not settings:
        return []
    return [
        _in_container(
            GATED_DEVICE_ENV,
            container,
            f"sets {name}, which asks the NVIDIA toolkit for {GATED_DEVICE_ENVS[name]}, devices no allocation chose",
            f"remove {name} ({_GATED_WAY_OUT.get(name, _NVSWITCH_WAY_OUT)})",
        )
        for container, name in settings
        if name in GATED_DEVICE_ENVS
    ]


#: Where each gated device comes from legitimately: the NVIDIA device plugin sets three of the variables itself on
#: the containers it allocates GPUs to, where the cluster enables them (k8s-device-plugin
#: ``internal/plugin/server.go``).
_GATED_WAY_OUT = {
    "NVIDIA_GDS": "the device plugin sets it with its GPUs where gds-enabled is on",
    "NVIDIA_MOFED": "the device plugin sets it with its GPUs where mofed-enabled is on",
    "NVIDIA_GDRCOPY": "the device plugin sets it with its GPUs where gdrcopy-enabled is on",
}
_NVSWITCH_WAY_OUT = "NVSwitch devices are the fabric manager's, a node service"


def volume_type(pod: _Pod) -> list[Violation]:
    """A volume's type is each of its keys but ``name`` (the API allows one; it defaults a volume with none to
    ``emptyDir``, so none is no violation). Judged at creation only: volumes cannot be added by an update, and an
    ephemeral container that mounts one reuses what the kubelet set up when the pod started."""
    if not pod.whole_pod:
        return []
    others = _other_volumes(pod)
    if not others:
        return []
    allowed = pod.config.allowed_volume_keys
    found: list[Violation] = []
    for volume in others:
        for kind in volume:
            if kind in allowed or kind == HOST_PATH_VOLUME:  # hostPath: host-device-path's and host-path's
                continue
            hint = _VOLUME_TYPE_HINTS.get(kind, "use a persistentVolumeClaim, or ask for the type to be allowed")
            found.append(
                Violation(
                    VOLUME_TYPE,
                    None,
                    f"volume {_quote(volume.get('name'))} is of type {_quote(kind)}, which is not on the volume type "
                    "allowlist (allowed_volume_types): the kubelet sets it up on the node from what the pod says",
                    hint,
                )
            )
    return found


_VOLUME_TYPE_HINTS = {
    "gitRepo": "clone the repository in an init container into an emptyDir instead",
}


def host_process(pod: _Pod) -> list[Violation]:
    """The containers' settings are found by ``privileged``'s pass over the security contexts (within ``validate``;
    alone, that pass is made here)."""
    containers = pod.memo.get("host process")
    if containers is None:
        privileged(pod)
        containers = pod.memo["host process"]
    found: list[Violation] = []
    security = pod.spec.get("securityContext")
    options = _mapping(security).get("windowsOptions") if security else None
    if pod.whole_pod and options and _mapping(options).get("hostProcess") is True:
        found.append(
            Violation(
                HOST_PROCESS,
                None,
                "the pod sets securityContext.windowsOptions.hostProcess, which runs its containers as processes "
                "of the Windows node with its devices and files",
                "remove securityContext.windowsOptions.hostProcess",
            )
        )
    for container in containers:
        found.append(
            _in_container(
                HOST_PROCESS,
                container,
                "sets securityContext.windowsOptions.hostProcess, which runs it as a process of the Windows node "
                "with its devices and files",
                "remove securityContext.windowsOptions.hostProcess",
            )
        )
    return found


def _host_ipc(pod: _Pod) -> bool:
    # immutable: judged when the pod was created
    return pod.whole_pod and _flag(pod.spec.get("hostIPC"))


_HOST_IPC_FIX = "remove hostIPC (an emptyDir with medium Memory at /dev/shm serves the pod's own processes)"


def host_ipc(pod: _Pod) -> list[Violation]:
    if not pod.spec.get("hostIPC") or pod.config.host_ipc is not _REJECT or not _host_ipc(pod):
        return []
    return [
        Violation(
            HOST_IPC,
            None,
            "the pod shares the node's IPC namespace (hostIPC), where the runtime mounts the node's /dev/shm writable "
            "into it and other hostIPC pods' shared memory (NCCL's among them) is open to it",
            _HOST_IPC_FIX,
        )
    ]


RULE_CHECKS: tuple[tuple[Rule, Callable[[_Pod], list[Violation]]], ...] = tuple(
    zip(
        RULES,
        (
            unpinned_container,
            visible_devices_env,
            visible_devices_none,
            gpu_env_from,
            privileged,
            sys_admin_capability,
            added_capability,
            host_pid,
            device_list_mount,
            cdi_annotation,
            runtime_annotation,
            host_device_path,
            host_path,
            mig_control_env,
            imex_channels_env,
            bound_gpu_pod,
            kai_annotation_update,
            gated_device_env,
            volume_type,
            host_process,
            host_ipc,
        ),
        strict=True,
    )
)


_CHECKS = tuple(check for rule, check in RULE_CHECKS if rule.id not in UPDATE_RULES)


def _warnings(pod: _Pod) -> list[Violation]:
    # Loops over lists that are nearly always empty, not generators: this runs for every pod admitted.
    warnings: list[Violation] = []
    config = pod.config
    if config.env_from_on_gpu_containers is _WARN:
        for container in _env_from_gaps(pod):
            warnings.append(
                _in_container(
                    GPU_ENV_FROM,
                    container,
                    f"requests a GPU and uses envFrom, which gpu-fence cannot check for {VISIBLE_DEVICES_ENV}",
                    "set the variables with env instead of envFrom",
                )
            )
    if config.visible_devices_none is _WARN:
        for container, name in _none_settings(pod):
            warnings.append(
                _in_container(
                    VISIBLE_DEVICES_NONE,
                    container,
                    f"sets {name}=none, which toolkit 1.18.0-1.18.1 (jit-cdi) read as all",
                    "use void",
                )
            )
    if config.host_ipc is _WARN and _host_ipc(pod):
        warnings.append(
            Violation(HOST_IPC, None, "the pod shares the node's IPC namespace and /dev/shm (hostIPC)", _HOST_IPC_FIX)
        )
    if pod.whole_pod:
        runtime_class = pod.spec.get("runtimeClassName")
        if (
            isinstance(runtime_class, str)
            and runtime_class in config.nvidia_runtime_class_set
            and not any(container.gpu or container.kai_fraction or container.claims for container in pod.containers)
        ):
            warnings.append(
                Violation(
                    NVIDIA_RUNTIME_CLASS,
                    None,
                    f"runtimeClassName {_quote(runtime_class)} on a pod with no GPU container: its containers are "
                    f"pinned to {VISIBLE_DEVICES_ENV}=void",
                )
            )
    return warnings


# --------------------------------------------------------------------------------------------------------------
# The policy's entry points


def _escape(segment: str) -> str:
    """RFC 6901: ``~`` first, then ``/``, or ``~1`` written by the first step would be read back as ``/``."""
    return segment.replace("~", "~0").replace("/", "~1")


def _pointer(*segments: str | int) -> str:
    return "".join("/" + _escape(str(segment)) for segment in segments)


_FIELD_POINTERS = {field: _pointer("spec", field) for field in CONTAINER_FIELDS}


def mutate(pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None) -> Mutation:
    """Pin ``NVIDIA_VISIBLE_DEVICES=void`` (and each configured alias) on every container that requests no
    device-plugin GPU and has no such entry; nothing else.

    ``void`` is explicit because an unset variable means ``all`` on legacy CUDA images. An existing entry is
    never touched (validation judges it) and never duplicated, so mutating the mutated pod yields no patch.
    KAI's fraction container gets the ``NVIDIA_VISIBLE_DEVICES`` pin too: KAI's webhook drops any entry of that
    name and appends its reference (``AddEnvVarToContainer``), and where it does not run, nothing else would
    fill the variable. ``only`` restricts the pin to these ephemeral containers (``pods/ephemeralcontainers``
    UPDATE).
    """
    view = _read_pod(pod, config, only)
    operations: list[dict[str, Any]] = []
    pinned: list[str] = []
    for container in view.containers:
        pins = container.pins
        if not pins or not container.env_readable:
            continue  # a GPU container; or nothing can be appended, which unpinned-container reports
        path = f"{_FIELD_POINTERS[container.field]}/{container.index}/env"
        if container.body.get("env") is None:  # absent or null: add the whole array ("/env/-" needs one)
            operations.append({"op": "add", "path": path, "value": [{"name": n, "value": PIN_VALUE} for n in pins]})
        elif len(pins) == 1:  # _missing_pins inline for the usual single pin: this runs for every container
            pin = pins[0]
            for name, _ in container.env:
                if name == pin:
                    break
            else:
                operations.append({"op": "add", "path": path + "/-", "value": {"name": pin, "value": PIN_VALUE}})
                pinned.append(container.name)
            continue
        else:
            missing = _missing_pins(container)
            if not missing:
                continue
            for name in missing:
                operations.append({"op": "add", "path": path + "/-", "value": {"name": name, "value": PIN_VALUE}})
        pinned.append(container.name)
    if not operations:
        return NO_MUTATION
    return Mutation(patch=tuple(operations), pinned=tuple(pinned))


def validate(
    pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None, namespace: str | None = None
) -> Validation:
    """Judge the pod as it will run (after all mutation): every rule of ``RULES`` but ``UPDATE_RULES``, plus warnings.

    With ``only`` (a ``pods/ephemeralcontainers`` UPDATE) just those ephemeral containers are judged, with the
    hostPath volumes they mount; pod-level annotations and runtime class were judged when the pod was created.
    With ``gpu_node_taints`` configured, a pod that cannot land on a GPU node (``webhook.scope``) gets the
    violations of the rules that guard the node as warnings. ``namespace`` (the request's; else the pod's own) is
    named in the ways out of the violations.
    """
    view = _read_pod(pod, config, only)
    violations: list[Violation] = []
    for check in _CHECKS:  # a plain loop: one call per rule per review, nearly all of them answering []
        found = check(view)
        if found:
            violations += found
    warnings = _warnings(view)
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations and config.gpu_node_taints and not reaches_gpu_nodes(view.spec, config):
        guarded = [v for v in violations if _REACH.get(v.rule) is Reach.NODE]
        violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
        warnings = [*(_out_of_scope(v) for v in guarded), *warnings]
    if violations:
        violations = _with_ways_out(view, violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


_REACH = {rule.id: rule.reach for rule in RULES}


def _out_of_scope(violation: Violation) -> Violation:
    """A node rule's violation on a pod that cannot land on a GPU node, as the warning that says why it passes."""
    return Violation(
        violation.rule,
        violation.container,
        f"{violation.what} (allowed: the pod tolerates none of gpu_node_taints, so it runs on no GPU node)",
    )


def _with_ways_out(view: _Pod, violations: list[Violation], namespace: str | None) -> list[Violation]:
    """Each violation with its way out for trusted infrastructure (``webhook.ways_out``), where it has one. Only on
    the path of a pod that breaks a rule: the bodies are looked up here, not kept for every pod."""
    if namespace is None:
        namespace = view.metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = "<namespace>"
    bodies = {container.name: container.body for container in view.containers}
    every = [*_spec_containers(view.spec), *(container.body for container in view.containers)]
    answered: list[Violation] = []
    for violation in violations:
        if violation.way_out:
            answered.append(violation)
            continue
        body = bodies.get(violation.container) if violation.container is not None else None
        found = way_out(
            guards_node=_REACH.get(violation.rule) is Reach.NODE,
            container=body,
            spec=view.spec,
            containers=every,
            namespace=namespace,
        )
        if found is None:
            answered.append(violation)
        elif found.replaces_fix:
            answered.append(replace(violation, fix="", way_out=found.text))
        else:
            answered.append(replace(violation, way_out=found.text))
    return answered


def _annotations(pod: Any) -> Mapping[str, Any]:
    return _mapping(_mapping(pod.get("metadata")).get("annotations")) if isinstance(pod, dict) else _EMPTY


def validate_update(pod: Any, old_pod: Any, config: PolicyConfig, *, namespace: str | None = None) -> Validation:
    """Judge a plain pod UPDATE: the CDI and runtime annotations it adds or changes, on a pod KAI schedules the
    annotations KAI's binder reads that it adds, removes or changes, and, where ``gpu_node_taints`` scopes the node
    rules, tolerations that bring the pod into scope; nothing else.

    Containers, volumes and runtime class are immutable once a pod exists, but annotations are not: one added
    while the pod waits for its sandbox (a scheduling gate, a pending pod) reaches the runtime like one set at
    CREATE, and KAI's binder picks the ConfigMap it fills from the annotations as they are when it binds.
    Annotations that were already there were judged at CREATE (or let through in warn mode); judging them again
    would deny every later update of the pod, finalizer removal included. Tolerations can be added too, and a
    pending pod that now tolerates a GPU taint can be scheduled onto a GPU node: the node rules it was spared at
    CREATE judge it now. The GPU rules (``cdi-annotation``, ``kai-annotation-update``) are never out of scope.
    """
    old = _annotations(old_pod)
    new = _annotations(pod)
    added = {key: value for key, value in new.items() if key not in old or old[key] != value}
    changes = _kai_changes(pod, old, new, config)
    violations: list[Violation] = []
    if added or changes:
        view = _Pod({"annotations": added}, _EMPTY, (), (), config, True, {"kai changes": changes})
        violations += [*cdi_annotation(view), *runtime_annotation(view), *kai_annotation_update(view)]
    warnings: list[Violation] = []
    if config.gpu_node_taints and isinstance(pod, dict):
        if _enters_scope(pod, old_pod, config):
            # The whole pod's node rules, runtime-annotation among them (over every annotation, not only the added).
            whole = validate(pod, config, namespace=namespace)
            violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
            violations += [v for v in whole.violations if _REACH.get(v.rule) is Reach.NODE]
        elif not reaches_gpu_nodes(_mapping(pod.get("spec")), config):
            warnings = [_out_of_scope(v) for v in violations if _REACH.get(v.rule) is Reach.NODE]
            violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations:
        violations = _with_ways_out(_read_pod(pod, config, None), violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


def _enters_scope(pod: dict[str, Any], old_pod: Any, config: PolicyConfig) -> bool:
    """Whether the update brings a pod that could land on no GPU node into the node rules' scope (an old pod that
    cannot be read counts as out of scope, so the new one is judged)."""
    old_spec = _mapping(old_pod.get("spec")) if isinstance(old_pod, dict) else _EMPTY
    return reaches_gpu_nodes(_mapping(pod.get("spec")), config) and not reaches_gpu_nodes(old_spec, config)


def _kai_changes(
    pod: Any, old: Mapping[str, Any], new: Mapping[str, Any], config: PolicyConfig
) -> list[tuple[str, str]]:
    """``(key, "adds" | "removes" | "changes")`` for each annotation KAI's binder reads at bind time that the update
    touches, on a pod under a configured KAI scheduler (``schedulerName`` is immutable; on any other pod the
    annotations mean nothing to KAI)."""
    scheduler = _mapping(pod.get("spec")).get("schedulerName") if isinstance(pod, dict) else None
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return _NO_CHANGES
    changes: list[tuple[str, str]] = []
    for key in kai.BIND_TIME_ANNOTATIONS:
        if key in new and key not in old:
            changes.append((key, "adds"))
        elif key in old and key not in new:
            changes.append((key, "removes"))
        elif key in new and new[key] != old[key]:
            changes.append((key, "changes"))
    return changes


def exemption(pod: Any, config: PolicyConfig, *, namespace: str) -> str | None:
    """Why the pod is admitted untouched, or None. Only cluster-controlled facts count: no label or annotation
    a pod author sets can exempt a pod.

    Mirror pods are the exception that proves the rule: the kubelet never runs a pod from the API server that
    carries the mirror annotation (it only mirrors a static pod it runs from its own manifest), so faking the
    annotation gains nothing, while mutating a real mirror pod would fight the kubelet.
    """
    if isinstance(namespace, str) and namespace in config.exempt_namespace_set:
        return f"namespace {namespace} is exempt"
    if not isinstance(pod, dict):
        return None
    if MIRROR_POD_ANNOTATION in _mapping(_mapping(pod.get("metadata")).get("annotations")):
        return "mirror pod of a static pod (the kubelet runs it from its own manifest)"
    spec = _mapping(pod.get("spec"))
    # The ServiceAccount admission plugin defaults an empty name to "default" before webhooks run.
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    if isinstance(account, str) and isinstance(namespace, str):
        pair = f"{namespace}/{account}"
        if pair in config.exempt_service_account_set:
            return f"service account {pair} is exempt"
    return None


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars), several times cheaper than ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value


def apply_patch(document: Any, patch: Collection[Mapping[str, Any]]) -> Any:
    """Apply the ``add`` operations that ``mutate`` emits, copying only the objects on each path.

    The input is left untouched and unchanged subtrees are shared with the result, which keeps ``evaluate``
    cheap; a full deep copy of every pod would dominate the policy's own cost.
    """
    copies: dict[tuple[str, ...], Any] = {}

    def writable(tokens: tuple[str, ...]) -> Any:
        if tokens in copies:
            return copies[tokens]
        if not tokens:
            source = document
        else:
            parent = writable(tokens[:-1])
            key = tokens[-1]
            source = parent[int(key)] if isinstance(parent, list) else parent[key]
        duplicate = list(source) if isinstance(source, list) else dict(source)
        if tokens:
            parent = copies[tokens[:-1]]
            parent[int(tokens[-1]) if isinstance(parent, list) else tokens[-1]] = duplicate
        copies[tokens] = duplicate
        return duplicate

    for operation in patch:
        if operation.get("op") != "add":
            raise ValueError(f"apply_patch supports only 'add', not {operation.get('op')!r}")
        path = operation["path"]
        tokens = tuple(path.split("/")[1:])
        if "~" in path:  # unescape in the reverse order of escaping: "~01" is "~1", not "/"
            tokens = tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)
        target = writable(tokens[:-1])
        value = _copy_json(operation["value"])
        if isinstance(target, list) and tokens[-1] == "-":
            target.append(value)
        elif isinstance(target, list):
            target.insert(int(tokens[-1]), value)
        else:
            target[tokens[-1]] = value
    return copies.get((), document)


def evaluate(pod: Any, config: PolicyConfig, *, namespace: str) -> Decision:
    """What admission does end to end (and what the offline check reports): exemption, then mutation, then
    validation of the pod as mutated."""
    reason = exemption(pod, config, namespace=namespace)
    if reason is not None:
        return Decision(exempt=reason, mutation=NO_MUTATION, validation=NO_VIOLATIONS)
    mutation = mutate(pod, config)
    patched = apply_patch(pod, mutation.patch) if mutation.patch else pod
    return Decision(exempt=None, mutation=mutation, validation=validate(patched, config, namespace=namespace))
