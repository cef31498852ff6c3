"""The admission policy's configuration: one YAML file, one frozen dataclass, every default written here once.

The file is read once at start (``load_config``) and validated completely, so that a typo fails the rollout
with an error naming the key instead of silently weakening the policy. The derived lookups the hot path needs
(compiled resource matcher, frozensets) are cached on the instance, so they are built once per config too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from enum import Enum, StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import Any

import yaml

from gpu_fence import kai
from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCES, VISIBLE_DEVICES_ENV, GpuResources

from .host_paths import DEFAULT_HOST_DEVICE_PATHS, HostPathEntry, clean_path, reaches_protected

__all__ = [
    "CDI_ANNOTATION_PREFIXES",
    "DEFAULT_ALLOWED_CAPABILITIES",
    "DEFAULT_ALLOWED_VOLUME_TYPES",
    "DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES",
    "DEFAULT_HOST_DEVICE_PATHS",
    "SHARED_NAMESPACE_CAPABILITIES",
    "VOLUME_TYPES",
    "ConfigError",
    "GpuTaint",
    "HostPathEntry",
    "PolicyConfig",
    "SharedNamespace",
    "Switch",
    "TaintEffect",
    "capability_name",
    "config_from_mapping",
    "load_config",
]

#: Capabilities a container may add (``added-capability``): every one that acts only on what the container already
#: holds (its own files and processes, the pod's network and IPC namespaces, its own memory, CPU and file limits), and
#: so reaches no GPU it was not allocated, no other pod's process and not the node. The other Linux capabilities
#: (capabilities(7)) are rejected, each for what it reaches: ``DAC_READ_SEARCH`` (host files by handle),
#: ``SYS_MODULE``, ``SYS_RAWIO``, ``BPF``, ``PERFMON``, ``SYSLOG``, ``SYS_TIME``, ``SYS_BOOT``, ``AUDIT_CONTROL``,
#: ``AUDIT_READ``, ``MAC_ADMIN``, ``MAC_OVERRIDE`` (the kernel and its global state), ``SYS_TTY_CONFIG``,
#: ``LINUX_IMMUTABLE``, ``SYS_PACCT``, ``WAKE_ALARM``, ``BLOCK_SUSPEND`` (node devices and node state), and names
#: unknown to gpu-fence: it is an allowlist, so a capability added to the kernel later is rejected until reviewed.
#: docs/policy.md ("added-capability") gives the reason for each. ``SYS_ADMIN`` and ``ALL`` are
#: ``sys-admin-capability``'s and cannot be listed; :data:`SHARED_NAMESPACE_CAPABILITIES` takes some back where the pod
#: shares a namespace with the node or between its containers.
DEFAULT_ALLOWED_CAPABILITIES: tuple[str, ...] = (
    # containerd's default set (Pod Security baseline's list plus NET_RAW): files, identity and signals of the
    # container's own processes, ports and raw sockets of the pod's network namespace.
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
    # Within the pod's own namespaces and limits: service-mesh iptables (NET_ADMIN), NCCL and RDMA locked memory
    # (IPC_LOCK, SYS_RESOURCE), NUMA and CPU pinning (SYS_NICE), debuggers and profilers of the container's own
    # processes (SYS_PTRACE), checkpointing (CHECKPOINT_RESTORE), the pod's IPC objects, file leases.
    "CHECKPOINT_RESTORE",
    "IPC_LOCK",
    "IPC_OWNER",
    "LEASE",
    "NET_ADMIN",
    "NET_BROADCAST",
    "SYS_NICE",
    "SYS_PTRACE",
    "SYS_RESOURCE",
)


class SharedNamespace(StrEnum):
    """A pod field that shares a namespace the pod's containers would otherwise have to themselves; its value is
    the field's name in the pod spec."""

    HOST_NETWORK = "hostNetwork"  # the node's network namespace
    SHARE_PROCESS_NAMESPACE = "shareProcessNamespace"  # one PID namespace for all the pod's containers


#: Capabilities that reach past the pod once it shares a namespace, even where the allowlist admits them: with
#: ``hostNetwork``, ``NET_ADMIN`` reconfigures the node's interfaces, routes and firewall (NetworkPolicy's own rules
#: among them) and ``NET_RAW`` reads and forges the node's traffic, every pod's on that node included; with
#: ``shareProcessNamespace``, ``SYS_PTRACE`` attaches to the other containers' processes, the GPU container's CUDA
#: context included, from a container that was allocated no GPU. ``hostPID`` needs no entry: ``host-pid`` rejects it
#: whatever the capabilities.
SHARED_NAMESPACE_CAPABILITIES: Mapping[SharedNamespace, frozenset[str]] = MappingProxyType(
    {
        SharedNamespace.HOST_NETWORK: frozenset({"NET_ADMIN", "NET_RAW"}),
        SharedNamespace.SHARE_PROCESS_NAMESPACE: frozenset({"SYS_PTRACE"}),
    }
)

#: Pod annotation key prefixes with which a pod asks for CDI devices: the toolkit's NRI plugin reads
#: ``nvidia.cdi.k8s.io`` (with no "/" boundary), runtimes that pass pod annotations through read ``cdi.k8s.io/``.
#: Always judged (``cdi-annotation``), so not configurable.
CDI_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io")

#: Pod annotation key prefixes with which a pod asks the container runtime, or an NRI plugin on the node, for device
#: nodes or host mounts: CRI-O's device annotation (``devices.crio.io``, formerly ``io.kubernetes.cri-o.Devices``;
#: cri-o ``pkg/annotations/v2/annotations.go``) and containerd NRI's device-injector plugin (devices, CDI devices,
#: mounts; new and deprecated prefixes, containerd/nri ``plugins/device-injector/device-injector.go``). They take
#: effect only where an administrator enabled them, which admission cannot see. The CDI prefixes are
#: ``cdi-annotation``'s and always judged.
DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES: tuple[str, ...] = (
    "devices.crio.io",
    "io.kubernetes.cri-o.Devices",
    "devices.noderesource.dev",
    "devices.nri.io",
    "cdi-devices.noderesource.dev",
    "cdi-devices.nri.io",
    "mounts.noderesource.dev",
    "mounts.nri.io",
)

#: The volume types a pod may use (``volume-type``): Pod Security ``restricted``'s list (kubernetes
#: ``staging/src/k8s.io/pod-security-admission/policy/check_restrictedVolumes.go``), whose volumes come from API
#: objects (ConfigMaps, Secrets, claims bound to PersistentVolumes, the pod's own fields) or from a CSI driver, plus
#: ``image``, an OCI image the runtime mounts read-only as it does the container's own. Every other in-tree type is
#: set up by the kubelet on the node from what the pod says (``gitRepo`` runs git there as root; ``fc``, ``iscsi``,
#: ``rbd`` attach the disks or targets the pod names). hostPath is judged by ``host-device-path`` and ``host-path``.
DEFAULT_ALLOWED_VOLUME_TYPES: tuple[str, ...] = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "image",
)
#: The volume type of a hostPath volume: never listed in ``allowed_volume_types``, its own rules judge it.
HOST_PATH_VOLUME = "hostPath"
#: Every volume type of the core/v1 ``Volume`` (its fields but ``name``, Kubernetes 1.31 to 1.37; ``image`` is new
#: in 1.31): what an entry of ``allowed_volume_types`` may name.
VOLUME_TYPES = frozenset(
    {
        "awsElasticBlockStore",
        "azureDisk",
        "azureFile",
        "cephfs",
        "cinder",
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "fc",
        "flexVolume",
        "flocker",
        "gcePersistentDisk",
        "gitRepo",
        "glusterfs",
        "hostPath",
        "image",
        "iscsi",
        "nfs",
        "persistentVolumeClaim",
        "photonPersistentDisk",
        "portworxVolume",
        "projected",
        "quobyte",
        "rbd",
        "scaleIO",
        "secret",
        "storageos",
        "vsphereVolume",
    }
)


class TaintEffect(StrEnum):
    """The taint effects that keep a pod that does not tolerate them off a node: the scheduler honours both, the
    kubelet ``NoExecute`` only (``PreferNoSchedule`` keeps nobody off)."""

    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class GpuTaint:
    """A taint that GPU nodes carry from the moment they register (``gpu_node_taints``)."""

    key: str
    value: str
    effect: TaintEffect


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/[-A-Za-z0-9_.]+$")
_CAPABILITY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ANNOTATION_PREFIX = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
#: The capabilities that ``sys-admin-capability`` judges; the allowlist cannot open them.
SYS_ADMIN_CAPABILITIES = frozenset({"SYS_ADMIN", "ALL"})


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the key (and the file) to fix."""


class Switch(Enum):
    """What a rule with a choice does with what it finds: return it as a warning, or reject the pod."""

    WARN = "warn"
    REJECT = "reject"


def capability_name(name: str) -> str:
    """A capability as the runtimes read it: case-insensitive, with or without the ``CAP_`` prefix."""
    return name.upper().removeprefix("CAP_")


def _set_of(field_name: str) -> cached_property[frozenset[str]]:
    """A tuple field of the config as a frozenset, built once, on first use."""
    return cached_property(lambda config: frozenset(getattr(config, field_name)))


@dataclass(frozen=True)
class PolicyConfig:
    """What the admission policy needs to know about the cluster. Defaults suit a stock GPU Operator install."""

    #: Resource names (``prefix*`` allowed) whose positive quantity makes a container a GPU container.
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    #: Extra env names the node's toolkit reads instead of NVIDIA_VISIBLE_DEVICES (its ``swarm-resource``, V13):
    #: validated like it, and pinned to ``void`` beside it.
    visible_devices_aliases: tuple[str, ...] = ()
    #: schedulerName values under which KAI fraction annotations are trusted as a GPU allocation.
    kai_scheduler_names: tuple[str, ...] = kai.DEFAULT_SCHEDULER_NAMES
    #: runtimeClassName values whose handler is the NVIDIA runtime (warned about on pods with no GPU container).
    nvidia_runtime_classes: tuple[str, ...] = ("nvidia", "nvidia-cdi", "nvidia-legacy")
    #: Namespaces whose pods are admitted untouched (the webhook's own namespace is added by ``load_config``).
    exempt_namespaces: tuple[str, ...] = ("kube-system",)
    #: ``namespace/serviceaccount`` pairs whose pods are admitted untouched (GPU Operator operands, for example).
    exempt_service_accounts: tuple[str, ...] = ()
    #: Host paths added to ``DEFAULT_HOST_DEVICE_PATHS`` for ``host-device-path`` (the defaults cannot be removed).
    extra_host_device_paths: tuple[str, ...] = ()
    #: The only host paths a hostPath volume may name (``host-path``), each exactly, read-only unless writable.
    host_path_allowlist: tuple[HostPathEntry, ...] = ()
    #: Capabilities ``securityContext.capabilities.add`` may name (``added-capability``): upper case, no ``CAP_``.
    allowed_capabilities: tuple[str, ...] = DEFAULT_ALLOWED_CAPABILITIES
    #: Pod annotation key prefixes that ask the runtime or an NRI plugin for devices or mounts
    #: (``runtime-annotation``).
    forbidden_annotation_prefixes: tuple[str, ...] = DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES
    #: ``envFrom`` on a container that gets its GPU from the device plugin: a warning, or a rejection
    #: (``gpu-env-from``).
    env_from_on_gpu_containers: Switch = Switch.WARN
    #: ``NVIDIA_VISIBLE_DEVICES=none`` set in the pod: a warning, or a rejection (``visible-devices-none``).
    visible_devices_none: Switch = Switch.WARN
    #: The volume types a pod's volumes may have (``volume-type``); hostPath is judged by its own rules.
    allowed_volume_types: tuple[str, ...] = DEFAULT_ALLOWED_VOLUME_TYPES
    #: ``hostIPC`` on a pod: a rejection, or a warning (``host-ipc``).
    host_ipc: Switch = Switch.REJECT
    #: Taints every GPU node carries from registration. When set, the rules that guard the node judge only pods that
    #: can land on a GPU node (``webhook.scope``); empty, the default, every pod is judged by every rule.
    gpu_node_taints: tuple[GpuTaint, ...] = ()
    #: ``schedulerName`` values whose scheduler keeps pods off nodes whose taints they do not tolerate; a pod that
    #: names another is judged as if it tolerated the GPU taints.
    taint_aware_schedulers: tuple[str, ...] = ("default-scheduler",)

    def __post_init__(self) -> None:
        # Callers building a config in code may pass lists, or a switch by its name; keep every value hashable,
        # immutable and typed.
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in _SWITCHES:
                if not isinstance(value, Switch):
                    object.__setattr__(self, field.name, Switch(value))
            elif not isinstance(value, tuple):
                object.__setattr__(self, field.name, tuple(value))

    # The lists the policy tests membership in for every pod, as sets built on first use.
    kai_scheduler_set = _set_of("kai_scheduler_names")
    nvidia_runtime_class_set = _set_of("nvidia_runtime_classes")
    exempt_namespace_set = _set_of("exempt_namespaces")
    exempt_service_account_set = _set_of("exempt_service_accounts")
    allowed_capability_set = _set_of("allowed_capabilities")
    taint_aware_scheduler_set = _set_of("taint_aware_schedulers")

    @cached_property
    def gpu_resource_set(self) -> GpuResources:
        return GpuResources.from_patterns(self.gpu_resources)

    @cached_property
    def allowed_volume_keys(self) -> frozenset[str]:
        """The keys of a volume ``volume-type`` passes without a look: ``name`` and the allowed types (``hostPath`` is
        never one: its own rules judge it)."""
        return frozenset((*self.allowed_volume_types, "name"))

    @cached_property
    def pin_names(self) -> tuple[str, ...]:
        """The env names pinned to ``void`` on a container that gets no GPU, in the order the pins are added."""
        return (VISIBLE_DEVICES_ENV, *self.visible_devices_aliases)

    @cached_property
    def visible_devices_names(self) -> frozenset[str]:
        """Env names whose value decides what GPUs a container sees."""
        return frozenset(self.pin_names)

    @cached_property
    def host_device_paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*DEFAULT_HOST_DEVICE_PATHS, *self.extra_host_device_paths)))

    @cached_property
    def host_path_writable(self) -> Mapping[str, bool]:
        """The allowlist as a lookup: cleaned host path → whether writable mounts of it are allowed."""
        return {entry.path: entry.writable for entry in self.host_path_allowlist}

    @cached_property
    def device_annotation_prefixes(self) -> Mapping[str, tuple[str, ...]]:
        """Every annotation key prefix some rule rejects (the CDI ones and the forbidden runtime ones), by first
        character: a key is compared with the few prefixes that could start it, not with all of them."""
        index: dict[str, tuple[str, ...]] = {}
        for prefix in (*CDI_ANNOTATION_PREFIXES, *self.forbidden_annotation_prefixes):
            index[prefix[0]] = (*index.get(prefix[0], ()), prefix)
        return index


_SWITCHES = frozenset({"env_from_on_gpu_containers", "visible_devices_none", "host_ipc"})
_ALLOWLIST = "host_path_allowlist"
_TAINTS = "gpu_node_taints"


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[str, str], None]:
    """The check of an entry that must match ``pattern``; the error calls the entry not ``what``."""

    def check(key: str, value: str) -> None:
        if not pattern.match(value):
            raise ConfigError(f"{key}: {value!r} is not {what}")

    return check


_check_namespace = _matching(_DNS_LABEL, "a namespace name (lowercase RFC 1123 label)")
_check_env_name = _matching(_ENV_NAME, "an environment variable name")
_check_subdomain = _matching(_DNS_SUBDOMAIN, "a valid name (lowercase RFC 1123 subdomain)")
_check_annotation_prefix = _matching(_ANNOTATION_PREFIX, "an annotation key prefix such as 'devices.crio.io'")


def _check_gpu_resource(key: str, value: str) -> None:
    name = value[:-1] if value.endswith("*") else value
    if "*" in name:
        raise ConfigError(f"{key}: {value!r}: '*' is allowed only at the end, as a prefix match")
    prefix_ok = value.endswith("*") and "/" in name and not name.startswith("/")
    if not prefix_ok and not _RESOURCE_NAME.match(name):
        raise ConfigError(
            f"{key}: {value!r} is not a domain-prefixed resource name such as 'nvidia.com/gpu' or 'nvidia.com/mig-*'"
        )


def _check_service_account(key: str, value: str) -> None:
    namespace, slash, name = value.partition("/")
    if not slash or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(
            f"{key}: {value!r} must be 'namespace/serviceaccount', e.g. 'gpu-operator/nvidia-device-plugin'"
        )


def _check_scheduler(key: str, value: str) -> None:
    if value != value.strip():
        raise ConfigError(f"{key}: {value!r} has surrounding whitespace")


def _check_host_path(key: str, value: str) -> None:
    if not value.startswith("/"):
        raise ConfigError(f"{key}: {value!r} must be an absolute path")
    if "*" in value[:-1]:
        raise ConfigError(f"{key}: {value!r}: '*' is allowed only at the end, as a name prefix match")


def _check_capability(key: str, value: str) -> None:
    name = capability_name(value)
    if not _CAPABILITY.match(name):
        raise ConfigError(f"{key}: {value!r} is not a capability name such as 'IPC_LOCK'")
    if name in SYS_ADMIN_CAPABILITIES:
        raise ConfigError(
            f"{key}: {value!r} cannot be allowed: the NVIDIA toolkit treats it as privileged "
            "(rule sys-admin-capability); exempt the pod's service account instead"
        )


_VOLUME_TYPES_BY_LOWER = {name.lower(): name for name in VOLUME_TYPES}


def _check_volume_type(key: str, value: str) -> None:
    if value == HOST_PATH_VOLUME:
        raise ConfigError(
            f"{key}: hostPath volumes are judged by host-device-path and host-path, not by this list; "
            "name the paths in host_path_allowlist"
        )
    if value not in VOLUME_TYPES:
        close = get_close_matches(value, sorted(VOLUME_TYPES), n=1)
        hint = _VOLUME_TYPES_BY_LOWER.get(value.lower()) or (close[0] if close else "")
        known = f"did you mean {hint!r}?" if hint else "a field of the Pod's volumes such as 'nfs' or 'csi'"
        raise ConfigError(f"{key}: {value!r} is not a volume type ({known})")


_CHECKS = {
    "gpu_resources": _check_gpu_resource,
    "visible_devices_aliases": _check_env_name,
    "kai_scheduler_names": _check_scheduler,
    "nvidia_runtime_classes": _check_subdomain,
    "exempt_namespaces": _check_namespace,
    "exempt_service_accounts": _check_service_account,
    "extra_host_device_paths": _check_host_path,
    "allowed_capabilities": _check_capability,
    "forbidden_annotation_prefixes": _check_annotation_prefix,
    "taint_aware_schedulers": _check_scheduler,
    "allowed_volume_types": _check_volume_type,
}
#: How a checked entry is stored: capabilities in the one spelling the policy compares.
_NORMALISE = {"allowed_capabilities": capability_name}
#: Keys that must not be empty: with no GPU resources every GPU container would be pinned to ``void``.
_NON_EMPTY = frozenset({"gpu_resources"})


def _string_list(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of strings, got {type(value).__name__} {value!r:.60}")
    normalise = _NORMALISE.get(key)
    items: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{key}[{index}]: expected a non-empty string, got {item!r:.60}")
        _CHECKS[key](f"{key}[{index}]", item)
        items.append(normalise(item) if normalise else item)
    if not items and key in _NON_EMPTY:
        raise ConfigError(f"{key}: must list at least one resource name")
    return tuple(dict.fromkeys(items))


def _switch(key: str, value: Any) -> Switch:
    choices = [switch.value for switch in Switch]
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r:.60}")
    return Switch(value)


def _host_path_entry(key: str, item: Any) -> HostPathEntry:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{key}: expected a mapping with 'path' and 'writable', got {item!r:.60}")
    unknown = [name for name in item if name not in ("path", "writable")]
    if unknown:
        raise ConfigError(f"{key}: unknown key {unknown[0]!r:.60}; an entry has 'path' and 'writable'")
    path, writable = item.get("path"), item.get("writable")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"{key}.path: expected an absolute host path, got {path!r:.60}")
    if "*" in path:
        raise ConfigError(f"{key}.path: {path!r:.60}: an entry names one path exactly; '*' is no pattern here")
    if clean_path(path) != path:
        raise ConfigError(f"{key}.path: {path!r:.60} is not in clean form; write {clean_path(path)!r:.60}")
    if path == "/":
        raise ConfigError(f"{key}.path: '/' is the whole node and cannot be allowed")
    if not isinstance(writable, bool):
        raise ConfigError(f"{key}.writable: expected true or false (whether writable mounts are allowed)")
    return HostPathEntry(path, writable)


def _host_path_allowlist(value: Any, protected: tuple[str, ...]) -> tuple[HostPathEntry, ...]:
    """Every entry checked alone, then against the protected paths and against the others: an entry that
    ``host-device-path`` rejects anyway is refused, and so is one inside a writable entry (a pod that mounts the
    writable one can put a symlink where this one is, and the runtime follows it on the host)."""
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ConfigError(f"{_ALLOWLIST}: expected a list of entries, got {type(value).__name__} {value!r:.60}")
    entries = [_host_path_entry(f"{_ALLOWLIST}[{index}]", item) for index, item in enumerate(value)]
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{_ALLOWLIST}[{index}].path"
        if entry.path in seen:
            raise ConfigError(f"{where}: {entry.path!r:.60} is listed twice")
        seen.add(entry.path)
        reached = next((p for p in protected if reaches_protected(entry.path, p)), None)
        if reached is not None:
            raise ConfigError(
                f"{where}: {entry.path!r:.60} exposes {reached}, which host-device-path always rejects; "
                "exempt the pod's service account instead"
            )
        outer = next((o for o in entries if o.writable and entry.path.startswith(o.path + "/")), None)
        if outer is not None:
            raise ConfigError(
                f"{where}: {entry.path!r:.60} is inside the writable entry {outer.path!r:.60}, through which a pod "
                "could replace it with a symlink to anywhere on the node; make the outer entry read-only, or drop "
                "this one"
            )
    return tuple(entries)


def _taint_key(key: str, value: Any) -> str:
    """A taint key as the API validates it: a qualified name, ``[prefix/]name``, the prefix a DNS subdomain."""
    if isinstance(value, str):
        prefix, slash, name = value.rpartition("/")
        if _LABEL_NAME.match(name) and (not slash or (_DNS_SUBDOMAIN.match(prefix) and len(prefix) <= 253)):
            return value
    raise ConfigError(f"{key}: expected a taint key such as 'nvidia.com/gpu', got {value!r:.60}")


def _gpu_taint(key: str, item: Any) -> GpuTaint:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{key}: expected a mapping with 'key', 'value' and 'effect', got {item!r:.60}")
    unknown = [name for name in item if name not in ("key", "value", "effect")]
    if unknown:
        raise ConfigError(f"{key}: unknown key {unknown[0]!r:.60}; an entry has 'key', 'value' and 'effect'")
    value = item.get("value", "")
    if value is None:
        value = ""
    if not isinstance(value, str) or not _LABEL_VALUE.match(value):
        raise ConfigError(f"{key}.value: expected a taint value (a label value, may be empty), got {value!r:.60}")
    effect = item.get("effect")
    effects = [effect.value for effect in TaintEffect]
    if effect not in effects:
        raise ConfigError(
            f"{key}.effect: expected one of {', '.join(effects)} (the effects that keep pods off a node), "
            f"got {effect!r:.60}"
        )
    return GpuTaint(_taint_key(f"{key}.key", item.get("key")), value, TaintEffect(effect))


def _gpu_node_taints(value: Any) -> tuple[GpuTaint, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{_TAINTS}: expected a list of taints, got {type(value).__name__} {value!r:.60}")
    return tuple(dict.fromkeys(_gpu_taint(f"{_TAINTS}[{index}]", item) for index, item in enumerate(value)))


def config_from_mapping(data: Any, *, own_namespace: str | None = None) -> PolicyConfig:
    """Validate an already-parsed configuration document (a mapping of the keys of ``PolicyConfig``)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"the configuration must be a mapping of keys to values, got {type(data).__name__}")
    known = [field.name for field in fields(PolicyConfig)]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            hint = get_close_matches(str(key), known, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else f"; known keys: {', '.join(known)}"
            raise ConfigError(f"{key}: unknown configuration key{suggestion}")
        if key in _SWITCHES:
            values[key] = _switch(key, value)
        elif key == _TAINTS:
            values[key] = _gpu_node_taints(value)
        elif key != _ALLOWLIST:
            values[key] = _string_list(key, value)
    if _ALLOWLIST in data:  # after the other keys: it is checked against extra_host_device_paths too
        extra = values.get("extra_host_device_paths", ())
        protected = tuple(dict.fromkeys((*DEFAULT_HOST_DEVICE_PATHS, *extra)))
        values[_ALLOWLIST] = _host_path_allowlist(data[_ALLOWLIST], protected)
    if own_namespace is not None:
        _check_namespace("own namespace", own_namespace)
        namespaces = values.get("exempt_namespaces", PolicyConfig.exempt_namespaces)
        values["exempt_namespaces"] = tuple(dict.fromkeys((*namespaces, own_namespace)))
    return PolicyConfig(**values)


def load_config(path: str | None, *, own_namespace: str | None = None) -> PolicyConfig:
    """Read and validate the YAML configuration file; ``None`` gives the defaults.

    ``own_namespace`` is the webhook's own namespace: it is always exempt, so that the webhook can never block
    its own pods from starting (which would need a manual webhook removal to recover).
    """
    if path is None:
        return config_from_mapping({}, own_namespace=own_namespace)
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the configuration file: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: the configuration file is not UTF-8 text") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from error
    try:
        return config_from_mapping(data, own_namespace=own_namespace)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
