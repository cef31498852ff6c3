"""The pod as the rules read it: a :class:`PodView`, built once per call by :func:`read_pod`, and the passes over it
that several rules share (:class:`Passes`), each worked out by the first rule that asks and then read by the others.

The pod arrives as JSON decoded from the AdmissionReview or read from YAML: plain ``dict`` and ``list``, so the hot
path tests those concrete types (not the ``Mapping`` ABC), and formats no text unless something is wrong. Reading
never raises and never modifies the pod: what cannot be read becomes an ``unpinned-container`` violation (a
container list or entry that is not what the API allows cannot be pinned) or is read as absent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from gpu_fence.vocabulary import (
    CONTAINER_FIELDS,
    GATED_DEVICE_ENVS,
    IMEX_CHANNELS_ENV,
    MIG_CONTROL_ENVS,
    VISIBLE_DEVICES_ENV,
    has_resource_claims,
    kai_fraction_container,
    requests_device_plugin_gpu,
)

from ..config import PolicyConfig
from ..host_paths import clean_path, reaches_protected
from .values import RuleId, Violation, quote

#: One env entry that a rule reads, with its name: ``(name, entry)``.
EnvEntry = tuple[str, Mapping[str, Any]]


class ContainerView(NamedTuple):
    """One container under judgement, read once."""

    field: str  # initContainers, containers or ephemeralContainers
    position: int  # its index in that list
    name: str  # the container's name, or "field[position]" when it has none
    body: Mapping[str, Any]
    #: A device-plugin GPU request: the plugin sets NVIDIA_VISIBLE_DEVICES from the allocation, so the container is
    #: not pinned and must not set the variable (nor an alias) itself.
    gpu: bool
    #: KAI's fraction container of a pod that KAI binds: pinned to void like the others (KAI's webhook replaces the
    #: pin with its reference), aliases left alone (one would override KAI's value), KAI's reference accepted.
    kai_fraction: bool
    #: Lists DRA claims: pinned all the same (a claim may be for any device class, and NVIDIA's CDI specs set
    #: ``void`` themselves), but counts as getting a device.
    claims: bool
    #: Each readable env entry whose name a rule reads (``NVIDIA_VISIBLE_DEVICES``, its configured aliases, the MIG,
    #: IMEX and gated device variables; see :func:`watched_env_names`); the others (most of a typical env) no rule
    #: looks at, so they are dropped once here instead of skipped by every rule. Duplicates are all kept: the kubelet
    #: keeps the last, but every one of them is judged, so no ordering trick can hide a value.
    env: list[EnvEntry]
    env_readable: bool  # False when ``env`` is present but not a list: nothing can be appended to it
    pins: tuple[str, ...]  # the env names the container must carry (pinned to void by ``mutate``), in pin order


class HostPathVolume(NamedTuple):
    """A hostPath volume under judgement, with its path cleaned and the protected path it reaches (None if none)."""

    name: Any  # the pod author's JSON: usually a string
    path: str
    cleaned: str
    reaches: str | None


@dataclass(slots=True)
class SecurityContexts:
    """What the rules read from the containers' security contexts, in one pass over them."""

    privileged: list[ContainerView]
    #: each container that adds capabilities, with the names it adds (strings only)
    capability_additions: list[tuple[ContainerView, list[str]]]
    #: the containers that set ``windowsOptions.hostProcess``
    host_processes: list[ContainerView]


class AnnotationChange(Enum):
    """What a pod UPDATE does to an annotation KAI's binder reads; the value is the verb a message uses."""

    ADDS = "adds"
    REMOVES = "removes"
    CHANGES = "changes"


class KaiChange(NamedTuple):
    key: str
    change: AnnotationChange


@dataclass(slots=True)
class Passes:
    """The passes over a pod that several rules read alike: None until the first rule that needs one makes it."""

    #: ``(container, name)`` where the pod sets a visible-devices variable to a value the toolkit reads as ``none``,
    #: among the values ``visible-devices-env`` accepts (that rule finds them as it judges each value)
    none_settings: list[tuple[ContainerView, str]] | None = None
    security: SecurityContexts | None = None
    #: the annotation keys under any prefix an annotation rule forbids
    device_annotation_keys: list[str] | None = None
    #: the volumes with a key beyond ``name`` and the allowed volume types
    other_volumes: list[dict[str, Any]] | None = None
    host_path_volumes: list[HostPathVolume] | None = None
    #: ``(container, name)`` for each MIG, IMEX or gated device variable set
    device_variables: list[tuple[ContainerView, str]] | None = None


class PodView(NamedTuple):
    """What every rule reads, computed once per call (the hot path reads each container once)."""

    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    containers: tuple[ContainerView, ...]  # the containers under judgement (only the selected ones with ``only``)
    unreadable: tuple[Violation, ...]  # container lists or entries that are not what the API allows
    config: PolicyConfig
    whole_pod: bool  # False when judging only some ephemeral containers: pod-level rules were judged at CREATE
    passes: Passes
    #: the changes a plain pod UPDATE makes to KAI's bind-time annotations (``validate_update`` alone finds them)
    kai_changes: tuple[KaiChange, ...] = ()


EMPTY: Mapping[str, Any] = {}


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    # JSON and YAML decoders produce dicts; testing the concrete type keeps the hot path off the ABC machinery.
    return value if isinstance(value, dict) else EMPTY


def flag(value: Any) -> bool:
    """A boolean field as the API reads it (a YAML manifest may hold the string)."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def in_container(rule: RuleId, container: ContainerView, what: str, fix: str) -> Violation:
    """A violation by one container: what is wrong names the container first, quoted and clipped, as people read
    it."""
    return Violation(rule, container.name, f"container {quote(container.name)} {what}", fix)


def kai_fraction_name(pod: Mapping[str, Any], config: PolicyConfig) -> str | None:
    """KAI's fraction container, when the fraction annotations can be trusted: under a configured KAI scheduler
    and with no ``spec.nodeName`` at creation. A pod created bound to a node never meets KAI's scheduler or binder,
    so nothing would ever fill the ConfigMap its reference names, and the pod author's own ConfigMap of that name
    would be read instead."""
    spec = mapping(pod.get("spec"))
    # The scheduler first: nearly every pod names another (or none), and this runs for every pod admitted. Anything
    # but a string could not name a scheduler anyway (and is not hashable).
    scheduler = spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return None
    if bound_at_creation(spec):
        return None
    return kai_fraction_container(pod, config.kai_scheduler_set)


def bound_at_creation(spec: Mapping[str, Any]) -> bool:
    """Whether the pod is created bound to a node (``spec.nodeName``), so that no scheduler ever fits it."""
    node = spec.get("nodeName")
    return node is not None and node != ""


def read_pod(pod: Any, config: PolicyConfig, only: Collection[str] | None) -> PodView:
    """The pod as the rules read it: every container (with ``only``, just those ephemeral containers)."""
    if not isinstance(pod, dict):
        problem = Violation(
            RuleId.UNPINNED_CONTAINER,
            None,
            "the object is not a Pod (not a JSON object), so no container can be pinned",
            "submit a Pod manifest",
        )
        return PodView({}, {}, (), (problem,), config, only is None, Passes())
    spec = pod.get("spec")
    unreadable: list[Violation] = []
    if not isinstance(spec, dict):
        unreadable.append(
            Violation(
                RuleId.UNPINNED_CONTAINER,
                None,
                "the pod has no readable spec, so no container can be pinned",
                "give the Pod a spec object",
            )
        )
        spec = {}
    kai_name = kai_fraction_name(pod, config)
    watched = watched_env_names(config)
    resources = config.gpu_resource_set
    pin_names = config.pin_names
    fields = CONTAINER_FIELDS if only is None else ("ephemeralContainers",)
    containers: list[ContainerView] = []
    for field in fields:
        entries = spec.get(field)
        if entries is None:
            continue
        if not isinstance(entries, list):
            unreadable.append(
                Violation(
                    RuleId.UNPINNED_CONTAINER,
                    None,
                    f"spec.{field} is not a list, so its containers cannot be pinned",
                    f"make spec.{field} a list of containers",
                )
            )
            continue
        ephemeral = field == "ephemeralContainers"
        for position, body in enumerate(entries):
            if not isinstance(body, dict):
                label = f"{field}[{position}]"
                unreadable.append(
                    Violation(
                        RuleId.UNPINNED_CONTAINER,
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
                claims = "claims" in mapping(body.get("resources")) and has_resource_claims(body)
                pins = _KAI_PINS if fraction else pin_names
            env = body.get("env")
            if isinstance(env, list):
                readable, watched_env = True, _watched_env(env, watched)
            else:
                readable, watched_env = env is None, []
            containers.append(
                ContainerView(
                    field,
                    position,
                    name if named and name else f"{field}[{position}]",
                    body,
                    gpu,
                    fraction,
                    claims,
                    watched_env,
                    readable,
                    pins,
                )
            )
    metadata = mapping(pod.get("metadata"))
    return PodView(metadata, spec, tuple(containers), tuple(unreadable), config, only is None, Passes())


#: KAI's fraction container is pinned by ``NVIDIA_VISIBLE_DEVICES`` alone: an alias would override KAI's value.
_KAI_PINS = (VISIBLE_DEVICES_ENV,)

MIG_CONTROL_NAMES = frozenset(MIG_CONTROL_ENVS)
#: The device variables the toolkit reads besides the visible devices: the MIG control, IMEX and gated devices.
DEVICE_VARIABLE_NAMES = MIG_CONTROL_NAMES | {IMEX_CHANNELS_ENV} | GATED_DEVICE_ENVS.keys()


def watched_env_names(config: PolicyConfig) -> frozenset[str]:
    """Every env name some rule reads: the visible-devices names (``NVIDIA_VISIBLE_DEVICES`` and the configured
    aliases) and the device variables. A rule that reads another env name must be added here."""
    return config.visible_devices_names | DEVICE_VARIABLE_NAMES


def _watched_env(env: list[Any], watched: frozenset[str]) -> list[EnvEntry]:
    # The usual env, every entry an object with a name, in one comprehension: any other JSON value fails the
    # subscript, and a name found in ``watched`` (strings only) is a string. An entry that is no object, has no
    # name or an unhashable one raises, and the whole list takes the careful loop instead.
    try:
        return [(entry["name"], entry) for entry in env if entry["name"] in watched]
    except (TypeError, KeyError):
        pass
    found: list[EnvEntry] = []
    for entry in env:
        if isinstance(entry, dict):
            name = entry.get("name")
            if isinstance(name, str) and name in watched:  # the str test first: a list name is unhashable
                found.append((name, entry))
    return found


def missing_pins(container: ContainerView) -> tuple[str, ...]:
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


def spec_containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The init and regular containers of the spec (ephemeral ones never get a GPU), as far as they can be read."""
    for field in ("initContainers", "containers"):
        entries = spec.get(field)
        if isinstance(entries, list):
            yield from (body for body in entries if isinstance(body, dict))


def volume_mounts(container: ContainerView) -> Iterator[Mapping[str, Any]]:
    mounts = container.body.get("volumeMounts")
    if isinstance(mounts, list):
        yield from (mount for mount in mounts if isinstance(mount, dict))


# -- the passes several rules share ------------------------------------------------------------------------------


def security_contexts(pod: PodView) -> SecurityContexts:
    """The privileged containers, the capabilities added and the Windows host processes, in one pass over the
    containers' security contexts (``privileged``, the two capability rules and ``host-process`` read it)."""
    found = pod.passes.security
    if found is not None:
        return found
    privileged: list[ContainerView] = []
    additions: list[tuple[ContainerView, list[str]]] = []
    host_processes: list[ContainerView] = []
    for container in pod.containers:
        security = container.body.get("securityContext")
        if not isinstance(security, dict):
            continue
        if flag(security.get("privileged")):
            privileged.append(container)
        capabilities = security.get("capabilities")
        if capabilities:
            added = mapping(capabilities).get("add")
            if isinstance(added, list) and added:
                additions.append((container, [name for name in added if isinstance(name, str)]))
        options = security.get("windowsOptions")
        if options and mapping(options).get("hostProcess") is True:
            host_processes.append(container)
    found = pod.passes.security = SecurityContexts(privileged, additions, host_processes)
    return found


def device_annotation_keys(pod: PodView) -> list[str]:
    """The pod's annotation keys under any prefix an annotation rule forbids, found in one pass (compared only with
    the prefixes that share their first character); each rule then keeps those under its own prefixes."""
    keys = pod.passes.device_annotation_keys
    if keys is None:
        by_first = pod.config.device_annotation_prefixes
        keys = pod.passes.device_annotation_keys = [
            key
            for key in mapping(pod.metadata.get("annotations"))
            if isinstance(key, str) and (under := by_first.get(key[:1])) is not None and key.startswith(under)
        ]
    return keys


def other_volumes(pod: PodView) -> list[dict[str, Any]]:
    """The volumes that have a key but ``name`` and the allowed volume types: hostPath volumes (never an allowed
    type) and those ``volume-type`` rejects. One pass over the volumes for the three rules that read them; nearly
    every pod has none."""
    others = pod.passes.other_volumes
    if others is None:
        volumes = pod.spec.get("volumes")
        allowed = pod.config.allowed_volume_keys
        others = pod.passes.other_volumes = (
            [v for v in volumes if isinstance(v, dict) and not v.keys() <= allowed] if isinstance(volumes, list) else []
        )
    return others


def host_path_volumes(pod: PodView) -> list[HostPathVolume]:
    """Each hostPath volume under judgement: all of them, or with ``only`` those the new ephemeral containers mount
    (the rest were judged when the pod was created). Read once per pod: two rules share it."""
    found = pod.passes.host_path_volumes
    if found is not None:
        return found
    found = pod.passes.host_path_volumes = []
    hosts = [volume for volume in other_volumes(pod) if "hostPath" in volume]
    if hosts:
        mounted: set[str] | None = None
        if not pod.whole_pod:
            mounted = {m["name"] for c in pod.containers for m in volume_mounts(c) if isinstance(m.get("name"), str)}
        for volume in hosts:
            path = mapping(volume.get("hostPath")).get("path")
            name = volume.get("name")
            if not isinstance(path, str) or (
                mounted is not None and (not isinstance(name, str) or name not in mounted)
            ):
                continue
            cleaned = clean_path(path)
            reached = next((p for p in pod.config.host_device_paths if reaches_protected(cleaned, p)), None)
            found.append(HostPathVolume(name, path, cleaned, reached))
    return found


def device_variables(pod: PodView) -> list[tuple[ContainerView, str]]:
    """Each ``(container, name)`` that sets a MIG, IMEX or gated device variable: one pass over the watched env for
    the three rules that read them."""
    settings = pod.passes.device_variables
    if settings is None:
        settings = pod.passes.device_variables = [
            (container, name)
            for container in pod.containers
            for name, _ in container.env
            if name in DEVICE_VARIABLE_NAMES
        ]
    return settings
