"""The admission policy's configuration: one YAML file, one frozen dataclass, every default written here once.

The file is read once at start (``load_config``) and validated completely, so that a typo fails the rollout
with an error naming the key instead of silently weakening the policy. The derived lookups the hot path needs
(compiled resource matcher, frozensets) are cached on the instance, so they are built once per config too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from functools import cached_property
from typing import Any

import yaml

from gpu_fence import kai
from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCES, VISIBLE_DEVICES_ENV, GpuResources

#: Host paths that open a route to GPU devices or to what decides device access: device nodes, CDI spec
#: directories (a planted spec can name any device), the NVIDIA driver root, the kubelet's device-plugin and
#: pod-resources sockets, and container runtime sockets (which can start any container). A hostPath volume at or
#: above any of these is rejected (``/`` included); one inside them is rejected too, except inside ``/dev`` in
#: general (``/dev/shm``, ``/dev/fuse`` are not GPUs). A trailing ``*`` matches by name prefix (``/dev/nvidia*``
#: covers ``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-caps/...``).
DEFAULT_HOST_DEVICE_PATHS: tuple[str, ...] = (
    "/dev",
    "/dev/nvidia*",
    "/dev/dri",
    "/dev/char",
    "/etc/cdi",
    "/var/run/cdi",
    "/run/cdi",
    "/run/nvidia",
    "/var/run/nvidia",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/containerd",
    "/run/containerd",
    "/var/run/crio",
    "/run/crio",
    "/var/run/cri-dockerd.sock",
    "/run/cri-dockerd.sock",
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/[-A-Za-z0-9_.]+$")


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the key (and the file) to fix."""


@dataclass(frozen=True)
class PolicyConfig:
    """What the admission policy needs to know about the cluster. Defaults suit a stock GPU Operator install."""

    #: Resource names (``prefix*`` allowed) whose positive quantity makes a container a GPU container.
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    #: Extra env names the node's toolkit reads like NVIDIA_VISIBLE_DEVICES (its ``swarm-resource`` setting, V13).
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

    def __post_init__(self) -> None:
        # Callers building a config in code may pass lists; keep the value hashable and immutable.
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, tuple):
                object.__setattr__(self, field.name, tuple(value))

    @cached_property
    def gpu_resource_set(self) -> GpuResources:
        return GpuResources.from_patterns(self.gpu_resources)

    @cached_property
    def visible_devices_names(self) -> frozenset[str]:
        """Env names whose value decides what GPUs a container sees."""
        return frozenset((VISIBLE_DEVICES_ENV, *self.visible_devices_aliases))

    @cached_property
    def kai_scheduler_set(self) -> frozenset[str]:
        return frozenset(self.kai_scheduler_names)

    @cached_property
    def nvidia_runtime_class_set(self) -> frozenset[str]:
        return frozenset(self.nvidia_runtime_classes)

    @cached_property
    def exempt_namespace_set(self) -> frozenset[str]:
        return frozenset(self.exempt_namespaces)

    @cached_property
    def exempt_service_account_set(self) -> frozenset[str]:
        return frozenset(self.exempt_service_accounts)

    @cached_property
    def host_device_paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*DEFAULT_HOST_DEVICE_PATHS, *self.extra_host_device_paths)))


def _check_gpu_resource(key: str, value: str) -> None:
    name = value[:-1] if value.endswith("*") else value
    if "*" in name:
        raise ConfigError(f"{key}: {value!r}: '*' is allowed only at the end, as a prefix match")
    prefix_ok = value.endswith("*") and "/" in name and not name.startswith("/")
    if not prefix_ok and not _RESOURCE_NAME.match(name):
        raise ConfigError(
            f"{key}: {value!r} is not a domain-prefixed resource name such as 'nvidia.com/gpu' or 'nvidia.com/mig-*'"
        )


def _check_namespace(key: str, value: str) -> None:
    if not _DNS_LABEL.match(value):
        raise ConfigError(f"{key}: {value!r} is not a namespace name (lowercase RFC 1123 label)")


def _check_service_account(key: str, value: str) -> None:
    namespace, slash, name = value.partition("/")
    if not slash or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(
            f"{key}: {value!r} must be 'namespace/serviceaccount', e.g. 'gpu-operator/nvidia-device-plugin'"
        )


def _check_env_name(key: str, value: str) -> None:
    if not _ENV_NAME.match(value):
        raise ConfigError(f"{key}: {value!r} is not an environment variable name")


def _check_subdomain(key: str, value: str) -> None:
    if not _DNS_SUBDOMAIN.match(value):
        raise ConfigError(f"{key}: {value!r} is not a valid name (lowercase RFC 1123 subdomain)")


def _check_scheduler(key: str, value: str) -> None:
    if value != value.strip():
        raise ConfigError(f"{key}: {value!r} has surrounding whitespace")


def _check_host_path(key: str, value: str) -> None:
    if not value.startswith("/"):
        raise ConfigError(f"{key}: {value!r} must be an absolute path")
    if "*" in value[:-1]:
        raise ConfigError(f"{key}: {value!r}: '*' is allowed only at the end, as a name prefix match")


_CHECKS = {
    "gpu_resources": _check_gpu_resource,
    "visible_devices_aliases": _check_env_name,
    "kai_scheduler_names": _check_scheduler,
    "nvidia_runtime_classes": _check_subdomain,
    "exempt_namespaces": _check_namespace,
    "exempt_service_accounts": _check_service_account,
    "extra_host_device_paths": _check_host_path,
}
#: Keys that must not be empty: with no GPU resources every GPU container would be pinned to ``void``.
_NON_EMPTY = frozenset({"gpu_resources"})


def _string_list(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of strings, got {type(value).__name__} {value!r:.60}")
    items: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{key}[{index}]: expected a non-empty string, got {item!r:.60}")
        _CHECKS[key](f"{key}[{index}]", item)
        items.append(item)
    if not items and key in _NON_EMPTY:
        raise ConfigError(f"{key}: must list at least one resource name")
    return tuple(dict.fromkeys(items))


def config_from_mapping(data: Any, *, own_namespace: str | None = None) -> PolicyConfig:
    """Validate an already-parsed configuration document (a mapping of the keys of ``PolicyConfig``)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"the configuration must be a mapping of keys to lists, got {type(data).__name__}")
    known = [field.name for field in fields(PolicyConfig)]
    values: dict[str, tuple[str, ...]] = {}
    for key, value in data.items():
        if key not in known:
            hint = get_close_matches(str(key), known, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else f"; known keys: {', '.join(known)}"
            raise ConfigError(f"{key}: unknown configuration key{suggestion}")
        values[key] = _string_list(key, value)
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
