"""The admission policy: pin ``NVIDIA_VISIBLE_DEVICES=void`` on containers with no GPU, reject other GPU paths.

Pure functions over the Pod as a plain dict (as JSON-decoded from the AdmissionReview or read from YAML). They
never raise on malformed input and never modify it: what cannot be read is treated conservatively (a container
whose ``env`` is not a list cannot be pinned, so it is a violation) and a decision is always returned.

Reading order: the values returned, the rule table, how a pod is read, one function per rule (named after its
rule id), then ``mutate``, ``validate``, ``validate_update`` (a plain pod UPDATE), ``exemption`` and ``evaluate``,
which chains them as the offline check does. The GPU vocabulary (what is a GPU request, what a
``NVIDIA_VISIBLE_DEVICES`` value means) lives in ``gpu_fence.vocabulary``; the rule ids and their vectors are
those of the design and of ``docs/policy.md``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpu_fence.verdicts import Verdict
from gpu_fence.vocabulary import (
    CONTAINER_FIELDS,
    DEVICE_LIST_MOUNT_PREFIXES,
    MIG_CONTROL_ENVS,
    VISIBLE_DEVICES_ENV,
    kai_fraction_container,
    parse_visible_devices,
    requests_gpu_resource,
)
from gpu_fence.warning_text import MAX_WARNING_CHARS, clip

from .config import PolicyConfig

# --------------------------------------------------------------------------------------------------------------
# What the policy returns


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``container`` is None for pod-level rules; ``detail`` says what is wrong and the fix."""

    rule: str
    container: str | None
    detail: str

    @property
    def message(self) -> str:
        """The violation in one line, led by its rule id so that people and log searches find it: what denials,
        warnings and every report of the check say."""
        return f"{self.rule}: {self.detail}"


@dataclass(frozen=True)
class Mutation:
    """RFC 6902 operations to apply to the Pod (``()`` when nothing changes) and the containers they pin."""

    patch: tuple[dict[str, Any], ...]
    pinned: tuple[str, ...]


@dataclass(frozen=True)
class Validation:
    """Violations deny the pod (in ``enforce`` mode); warnings (each ≤ 120 characters) never do."""

    violations: tuple[Violation, ...]
    warnings: tuple[str, ...]

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """The distinct rule ids violated, in table order (for audit annotations and metrics)."""
        broken = {violation.rule for violation in self.violations}
        return tuple(rule.id for rule in RULES if rule.id in broken)


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    vectors: tuple[str, ...]


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
# The rules (the design's table, in its order; docs/policy.md has one section per id, tested against this)

UNPINNED_CONTAINER = "unpinned-container"
VISIBLE_DEVICES = "visible-devices-env"
PRIVILEGED = "privileged"
SYS_ADMIN_CAPABILITY = "sys-admin-capability"
DEVICE_LIST_MOUNT = "device-list-mount"
CDI_ANNOTATION = "cdi-annotation"
HOST_DEVICE_PATH = "host-device-path"
MIG_CONTROL_ENV = "mig-control-env"

RULES: tuple[Rule, ...] = (
    Rule(
        UNPINNED_CONTAINER,
        "a container with no GPU request is not pinned to NVIDIA_VISIBLE_DEVICES=void or none",
        ("V1", "V4", "V12"),
    ),
    Rule(
        VISIBLE_DEVICES,
        "NVIDIA_VISIBLE_DEVICES (or an alias) set to a GPU on a non-GPU container, set at all on "
        "a GPU container, or set through valueFrom or a $(...) reference",
        ("V2", "V3", "V13"),
    ),
    Rule(PRIVILEGED, "a privileged container sees every device of the node, GPUs included", ("V6",)),
    Rule(
        SYS_ADMIN_CAPABILITY,
        "capabilities.add with SYS_ADMIN or ALL, which the NVIDIA toolkit treats as privileged",
        ("V7",),
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
        HOST_DEVICE_PATH,
        "a hostPath volume at or above GPU device nodes, CDI specs, driver root, kubelet or runtime sockets",
        ("V11",),
    ),
    Rule(MIG_CONTROL_ENV, "NVIDIA_MIG_CONFIG_DEVICES or NVIDIA_MIG_MONITOR_DEVICES set", ("V14",)),
)

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
CDI_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io")
#: Host paths that are protected only at or above themselves: hostPaths inside ``/dev`` are judged by the more
#: specific entries (``/dev/nvidia*``, ``/dev/dri``, ``/dev/char``), so ``/dev/shm`` stays allowed.
_ANCESTOR_ONLY_PATHS = frozenset({"/dev"})
PIN_VALUE = "void"
_NAME_LIMIT = 63

# --------------------------------------------------------------------------------------------------------------
# Reading a pod


class _Container(NamedTuple):
    field: str
    index: int
    name: str  # the container's name, or "field[index]" when it has none
    body: Mapping[str, Any]
    gpu: bool
    kai_fraction: bool
    #: ``(name, entry)`` for each readable env entry whose name a rule reads (``NVIDIA_VISIBLE_DEVICES``, its
    #: configured aliases, the MIG control variables; see :func:`_watched_env_names`); the others (most of a
    #: typical env) no rule looks at, so they are dropped once here instead of skipped by every rule. Duplicates
    #: are all kept: the kubelet keeps the last, but every one of them is judged, so no ordering trick can hide a
    #: value.
    env: list[tuple[str, Mapping[str, Any]]]
    env_readable: bool  # False when ``env`` is present but not a list: nothing can be appended to it


class _Pod(NamedTuple):
    """What every rule reads, computed once per call (the hot path reads each container once)."""

    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    containers: tuple[_Container, ...]  # the containers under judgement (only the selected ones with ``only``)
    unreadable: tuple[Violation, ...]  # container lists or entries that are not what the API allows
    config: PolicyConfig
    whole_pod: bool  # False when judging only some ephemeral containers: pod-level rules were judged at CREATE


def _mapping(value: Any) -> Mapping[str, Any]:
    # JSON and YAML decoders produce dicts; testing the concrete type keeps the hot path off the ABC machinery.
    return value if isinstance(value, dict) else _EMPTY


_EMPTY: Mapping[str, Any] = {}


def _quote(text: Any) -> str:
    return '"' + clip(text if isinstance(text, str) else repr(text), _NAME_LIMIT) + '"'


def _in_container(rule: str, container: _Container, detail: str) -> Violation:
    """A violation by one container: its detail names the container first, quoted and clipped, as people read it."""
    return Violation(rule, container.name, f"container {_quote(container.name)} {detail}")


def _kai_fraction_name(pod: Mapping[str, Any], config: PolicyConfig) -> str | None:
    # The vocabulary looks schedulerName up in a set; anything but a string could not name a scheduler anyway.
    if not isinstance(_mapping(pod.get("spec")).get("schedulerName"), str):
        return None
    return kai_fraction_container(pod, config.kai_scheduler_set)


def _read_pod(pod: Any, config: PolicyConfig, only: Collection[str] | None) -> _Pod:
    # The hot path of every review: JSON input, so concrete ``dict``/``list`` checks (not the ``Mapping`` ABC), and
    # no text is formatted unless something is wrong.
    if not isinstance(pod, dict):
        problem = Violation(
            UNPINNED_CONTAINER,
            None,
            "the object is not a Pod (not a JSON object), so no container can be pinned; submit a Pod manifest",
        )
        return _Pod({}, {}, (), (problem,), config, only is None)
    spec = pod.get("spec")
    unreadable: list[Violation] = []
    if not isinstance(spec, dict):
        unreadable.append(
            Violation(
                UNPINNED_CONTAINER,
                None,
                "the pod has no readable spec, so no container can be pinned; give the Pod a spec object",
            )
        )
        spec = {}
    kai_name = _kai_fraction_name(pod, config)
    watched = _watched_env_names(config)
    resources = config.gpu_resource_set
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
                    f"spec.{field} is not a list, "
                    f"so its containers cannot be pinned; make spec.{field} a list of containers",
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
                        f"spec.{label} is not an object, so it cannot be pinned; make it a container object",
                    )
                )
                continue
            name = body.get("name")
            named = isinstance(name, str)
            if only is not None and (not named or name not in only):
                continue
            # Ephemeral containers can hold no resources and are never KAI's fraction container.
            gpu = not ephemeral and (
                requests_gpu_resource(body, resources) or (kai_name is not None and name == kai_name)
            )
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
                    gpu and name == kai_name,
                    watched_env,
                    readable,
                )
            )
    return _Pod(_mapping(pod.get("metadata")), spec, tuple(containers), tuple(unreadable), config, only is None)


def _watched_env_names(config: PolicyConfig) -> frozenset[str]:
    """Every env name some rule reads: the visible-devices names (``NVIDIA_VISIBLE_DEVICES`` and the configured
    aliases) and the MIG control variables. A rule that reads another env name must be added here."""
    return config.visible_devices_names | _MIG_CONTROL_NAMES


_MIG_CONTROL_NAMES = frozenset(MIG_CONTROL_ENVS)


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


def clean_path(path: str) -> str:
    """A path as the runtime compares it: ``..`` and ``.`` resolved, slashes collapsed, always absolute.

    Go's ``filepath.Clean`` (used by the toolkit) turns ``//x`` into ``/x`` where ``posixpath.normpath`` keeps
    the two leading slashes POSIX allows, so those are collapsed too.
    """
    cleaned = posixpath.normpath("/" + path)
    return "/" + cleaned.lstrip("/")


def _at_or_above(path: str, protected: str) -> bool:
    return path in ("/", protected) or protected.startswith(path + "/")


def _reaches_host_device(path: str, protected: str) -> bool:
    """True when a hostPath volume at ``path`` (cleaned) exposes the protected host path ``protected``."""
    if protected.endswith("*"):
        stem = protected[:-1]
        return path.startswith(stem) or _at_or_above(path, posixpath.dirname(stem))
    if protected in _ANCESTOR_ONLY_PATHS:
        return _at_or_above(path, protected)
    return _at_or_above(path, protected) or path.startswith(protected + "/")


# --------------------------------------------------------------------------------------------------------------
# One function per rule. Each takes the read pod and returns its violations.


def unpinned_container(pod: _Pod) -> list[Violation]:
    found = list(pod.unreadable)  # what cannot be read cannot be pinned
    for container in pod.containers:
        if container.gpu:
            continue
        if not container.env_readable:
            found.append(
                _in_container(
                    UNPINNED_CONTAINER,
                    container,
                    f"has an env that is not a list, so {VISIBLE_DEVICES_ENV}=void cannot be pinned; "
                    "make env a list of name/value",
                )
            )
        elif not _sets_visible_devices(container):
            found.append(
                _in_container(
                    UNPINNED_CONTAINER,
                    container,
                    f"requests no GPU and does not set {VISIBLE_DEVICES_ENV}"
                    f"; add env {VISIBLE_DEVICES_ENV}=void (or request nvidia.com/gpu)",
                )
            )
    return found


def _sets_visible_devices(container: _Container) -> bool:
    """True when the container has an ``NVIDIA_VISIBLE_DEVICES`` entry (whatever its value: validation judges it).

    A loop, not ``any()`` over a generator: this runs for every container admitted, and the generator costs more
    than the one or two entries it looks at."""
    for name, _ in container.env:  # noqa: SIM110
        if name == VISIBLE_DEVICES_ENV:
            return True
    return False


def _is_kai_injected(container: _Container, name: str, entry: Mapping[str, Any]) -> bool:
    """The one ``valueFrom`` allowed: KAI's binder points the fraction container at its reservation's ConfigMap."""
    value_from = entry.get("valueFrom")
    return (
        container.kai_fraction
        and name == VISIBLE_DEVICES_ENV
        and entry.get("value") in (None, "")
        and isinstance(value_from, dict)
        and list(value_from) == ["configMapKeyRef"]
    )


def visible_devices_env(pod: _Pod) -> list[Violation]:
    names = pod.config.visible_devices_names
    found: list[Violation] = []
    for container in pod.containers:
        for name, entry in container.env:
            if name not in names:
                continue
            value = entry.get("value")
            if entry.get("valueFrom") is not None:
                if _is_kai_injected(container, name, entry):
                    continue
                problem = f"sets {name} through valueFrom, which cannot be checked"
            elif value is not None and not isinstance(value, str):
                problem = f"sets {name} to a non-string value"
            elif value is not None and "$(" in value:
                problem = f"sets {name} with a $(...) reference, which cannot be checked"
            elif container.gpu:
                problem = (
                    f"requests a GPU and also sets {name}={_quote(value or '')}, which competes with the allocation"
                )
            elif parse_visible_devices(value or "").grants_no_gpu:
                continue
            else:
                problem = f"sets {name}={_quote(value)} but requests no GPU"
            fix = (
                f"remove {name} (the device plugin sets it from the allocation)"
                if container.gpu
                else f"request nvidia.com/gpu, or remove {name}"
            )
            found.append(_in_container(VISIBLE_DEVICES, container, f"{problem}; {fix}"))
    return found


def privileged(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    for container in pod.containers:
        flag = _mapping(container.body.get("securityContext")).get("privileged")
        if flag is True or (isinstance(flag, str) and flag.lower() == "true"):
            found.append(
                _in_container(
                    PRIVILEGED,
                    container,
                    "is privileged and sees every device of the node, GPUs included; remove "
                    "securityContext.privileged (request nvidia.com/gpu for a GPU)",
                )
            )
    return found


def sys_admin_capability(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    for container in pod.containers:
        capabilities = _mapping(_mapping(container.body.get("securityContext")).get("capabilities"))
        added = capabilities.get("add")
        if not isinstance(added, list):
            continue
        # Runtimes upper-case names and add the CAP_ prefix themselves, so "cap_sys_admin" is SYS_ADMIN too.
        for capability in added:
            if isinstance(capability, str) and capability.upper().removeprefix("CAP_") in ("SYS_ADMIN", "ALL"):
                found.append(
                    _in_container(
                        SYS_ADMIN_CAPABILITY,
                        container,
                        f"adds capability {_quote(capability)}, which the "
                        "NVIDIA toolkit treats as privileged; remove it from "
                        "securityContext.capabilities.add",
                    )
                )
                break
    return found


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
_DEVICE_LIST_MARKER = posixpath.basename(DEVICE_LIST_MOUNT_PREFIXES[0])
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
                        f"mounts a volume at {_quote(path)}, which the "
                        "NVIDIA toolkit reads as a GPU request; remove the volumeMount and request "
                        "nvidia.com/gpu",
                    )
                )
    return found


def cdi_annotation(pod: _Pod) -> list[Violation]:
    if not pod.whole_pod:
        return []
    return [
        Violation(
            CDI_ANNOTATION,
            None,
            f"pod annotation {_quote(key)} asks the runtime for CDI "
            "devices; remove the annotation and request nvidia.com/gpu",
        )
        for key in _mapping(pod.metadata.get("annotations"))
        if isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIXES)
    ]


def host_device_path(pod: _Pod) -> list[Violation]:
    volumes = pod.spec.get("volumes")
    if not isinstance(volumes, list):
        return []
    mounted: set[str] | None = None
    if not pod.whole_pod:  # judging new ephemeral containers: only the volumes they mount are new exposure
        mounted = {m["name"] for c in pod.containers for m in _volume_mounts(c) if isinstance(m.get("name"), str)}
    found: list[Violation] = []
    for volume in volumes:
        if not isinstance(volume, dict):
            continue
        path = _mapping(volume.get("hostPath")).get("path")
        name = volume.get("name")
        if not isinstance(path, str) or (mounted is not None and (not isinstance(name, str) or name not in mounted)):
            continue
        cleaned = clean_path(path)
        reached = next((p for p in pod.config.host_device_paths if _reaches_host_device(cleaned, p)), None)
        if reached is not None:
            found.append(
                Violation(
                    HOST_DEVICE_PATH,
                    None,
                    f"volume {_quote(name)} mounts host "
                    f"path {_quote(path)}, which exposes {reached}; remove the hostPath volume "
                    "(request nvidia.com/gpu for a GPU)",
                )
            )
    return found


def mig_control_env(pod: _Pod) -> list[Violation]:
    found: list[Violation] = []
    for container in pod.containers:
        for name, _ in container.env:
            if name in MIG_CONTROL_ENVS:
                found.append(
                    _in_container(
                        MIG_CONTROL_ENV, container, f"sets {name}, which controls MIG on the whole GPU; remove it"
                    )
                )
    return found


RULE_CHECKS: tuple[tuple[Rule, Callable[[_Pod], list[Violation]]], ...] = tuple(
    zip(
        RULES,
        (
            unpinned_container,
            visible_devices_env,
            privileged,
            sys_admin_capability,
            device_list_mount,
            cdi_annotation,
            host_device_path,
            mig_control_env,
        ),
        strict=True,
    )
)


def _warnings(pod: _Pod) -> list[str]:
    warnings: list[str] = []
    aliases = pod.config.visible_devices_aliases
    for container in pod.containers:
        if container.body.get("envFrom") is None:
            continue
        if container.gpu:
            warnings.append(
                f"container {_quote(container.name)} requests a GPU and uses envFrom, which gpu-fence "
                f"cannot check for {VISIBLE_DEVICES_ENV}"
            )
        elif aliases:  # the pin covers NVIDIA_VISIBLE_DEVICES, not an alias the toolkit reads first
            warnings.append(f"container {_quote(container.name)} uses envFrom, which may set {aliases[0]}")
    if pod.whole_pod:
        runtime_class = pod.spec.get("runtimeClassName")
        if (
            isinstance(runtime_class, str)
            and runtime_class in pod.config.nvidia_runtime_class_set
            and not any(container.gpu for container in pod.containers)
        ):
            warnings.append(
                f"runtimeClassName {_quote(runtime_class)} on a pod with no GPU container: its "
                f"containers are pinned to {VISIBLE_DEVICES_ENV}=void"
            )
    return [clip(warning, MAX_WARNING_CHARS) for warning in warnings]


# --------------------------------------------------------------------------------------------------------------
# The policy's entry points


def _escape(segment: str) -> str:
    """RFC 6901: ``~`` first, then ``/``, or ``~1`` written by the first step would be read back as ``/``."""
    return segment.replace("~", "~0").replace("/", "~1")


def _pointer(*segments: str | int) -> str:
    return "".join("/" + _escape(str(segment)) for segment in segments)


_FIELD_POINTERS = {field: _pointer("spec", field) for field in CONTAINER_FIELDS}


def mutate(pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None) -> Mutation:
    """Pin ``NVIDIA_VISIBLE_DEVICES=void`` on every non-GPU container that has no such entry; nothing else.

    ``void`` is explicit because an unset variable means ``all`` on legacy CUDA images. An existing entry is
    never touched (validation judges it) and never duplicated, so mutating the mutated pod yields no patch.
    ``only`` restricts the pin to these ephemeral containers (``pods/ephemeralcontainers`` UPDATE).
    """
    view = _read_pod(pod, config, only)
    operations: list[dict[str, Any]] = []
    pinned: list[str] = []
    for container in view.containers:
        if container.gpu:
            continue
        if not container.env_readable:
            continue  # nothing can be appended; unpinned-container reports it
        path = f"{_FIELD_POINTERS[container.field]}/{container.index}/env"
        if container.body.get("env") is None:  # absent or null: add the whole array ("/env/-" needs one)
            operations.append({"op": "add", "path": path, "value": [{"name": VISIBLE_DEVICES_ENV, "value": PIN_VALUE}]})
        elif _sets_visible_devices(container):
            continue
        else:
            operations.append(
                {"op": "add", "path": path + "/-", "value": {"name": VISIBLE_DEVICES_ENV, "value": PIN_VALUE}}
            )
        pinned.append(container.name)
    if not operations:
        return NO_MUTATION
    return Mutation(patch=tuple(operations), pinned=tuple(pinned))


def validate(pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None) -> Validation:
    """Judge the pod as it will run (after all mutation): every rule of ``RULES``, plus warnings.

    With ``only`` (a ``pods/ephemeralcontainers`` UPDATE) just those ephemeral containers are judged, with the
    hostPath volumes they mount; pod-level annotations and runtime class were judged when the pod was created.
    """
    view = _read_pod(pod, config, only)
    violations = [violation for _, check in RULE_CHECKS for violation in check(view)]
    warnings = _warnings(view)
    if not violations and not warnings:
        return NO_VIOLATIONS
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


def _annotations(pod: Any) -> Mapping[str, Any]:
    return _mapping(_mapping(pod.get("metadata")).get("annotations")) if isinstance(pod, dict) else _EMPTY


def validate_update(pod: Any, old_pod: Any, config: PolicyConfig) -> Validation:
    """Judge a plain pod UPDATE: the CDI annotations it adds or changes, nothing else.

    Containers, volumes and runtime class are immutable once a pod exists, but annotations are not: one added
    while the pod waits for its sandbox (a scheduling gate, a pending pod) reaches the runtime like one set at
    CREATE. Annotations that were already there were judged at CREATE (or let through in warn mode); judging
    them again would deny every later update of the pod, finalizer removal included.
    """
    old = _annotations(old_pod)
    added = {key: value for key, value in _annotations(pod).items() if key not in old or old[key] != value}
    if not added:
        return NO_VIOLATIONS
    violations = cdi_annotation(_Pod({"annotations": added}, _EMPTY, (), (), config, True))
    return Validation(violations=tuple(violations), warnings=()) if violations else NO_VIOLATIONS


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
    return Decision(exempt=None, mutation=mutation, validation=validate(patched, config))
