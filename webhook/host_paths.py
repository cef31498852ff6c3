"""Host paths: how a ``hostPath`` is cleaned and compared, the host paths that reach the node, and allowlist entries.

Pure. Two lists meet here. The *protected* host paths reach GPU devices, the container runtime, the kubelet or the
kernel; a hostPath volume at, above or (mostly) inside one is rejected by ``host-device-path`` whatever else is
configured. Every other hostPath is rejected by ``host-path`` unless the cluster's allowlist has an entry for
exactly that path. The configuration refuses an allowlist entry that a protected path would reject anyway, so the
two rules never disagree about a path.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

__all__ = [
    "DEFAULT_HOST_DEVICE_PATHS",
    "HostPathEntry",
    "clean_path",
    "reaches_protected",
]

#: Host paths that open a route to GPU devices or to what decides device access, or to the node itself:
#:
#: * device nodes (``/dev`` only at or above it: ``/dev/shm``, ``/dev/fuse``, ``/dev/infiniband`` are not GPUs);
#:   a trailing ``*`` matches by name prefix (``/dev/nvidia*``: ``/dev/nvidia0``, ``/dev/nvidiactl``,
#:   ``/dev/nvidia-uvm``, ``/dev/nvidia-caps/...``);
#: * CDI spec directories (a planted spec can name any device and hook), the GPU Operator's driver root, the NVIDIA
#:   container toolkit's configuration and its installed binaries (the runtime runs them as root);
#: * the kubelet's state (device-plugin, pod-resources and DRA plugin sockets, the plugin registry, every pod's
#:   volumes) and its static pod directory (static pods skip admission), container runtime sockets, configuration
#:   and storage (other containers' root filesystems);
#: * procfs and sysfs (``/proc/1/root`` is the host's ``/``; ``/sys/fs/cgroup`` moves processes between cgroups).
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
    "/etc/nvidia-container-runtime",
    "/usr/local/nvidia",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/containerd",
    "/run/containerd",
    "/var/run/crio",
    "/run/crio",
    "/var/run/cri-dockerd.sock",
    "/run/cri-dockerd.sock",
    "/etc/containerd",
    "/etc/crio",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/docker",
    "/proc",
    "/sys",
)

#: Protected only at or above themselves: hostPaths inside ``/dev`` are judged by the more specific entries
#: (``/dev/nvidia*``, ``/dev/dri``, ``/dev/char``), so that ``/dev/infiniband`` can be allowlisted for RDMA.
_ANCESTOR_ONLY_PATHS = frozenset({"/dev"})


@dataclass(frozen=True)
class HostPathEntry:
    """One entry of the hostPath allowlist: exactly this cleaned host path, read-only unless ``writable``."""

    path: str
    writable: bool = False


def clean_path(path: str) -> str:
    """A path as the runtime compares it: ``..`` and ``.`` resolved, slashes collapsed, always absolute.

    Go's ``filepath.Clean`` (used by the toolkit) turns ``//x`` into ``/x`` where ``posixpath.normpath`` keeps
    the two leading slashes POSIX allows, so those are collapsed too.
    """
    cleaned = posixpath.normpath("/" + path)
    return "/" + cleaned.lstrip("/")


def _at_or_above(path: str, protected: str) -> bool:
    return path in ("/", protected) or protected.startswith(path + "/")


def reaches_protected(path: str, protected: str) -> bool:
    """True when a hostPath volume at ``path`` (cleaned) exposes the protected host path ``protected``."""
    if protected.endswith("*"):
        stem = protected[:-1]
        return path.startswith(stem) or _at_or_above(path, posixpath.dirname(stem))
    if protected in _ANCESTOR_ONLY_PATHS:
        return _at_or_above(path, protected)
    return _at_or_above(path, protected) or path.startswith(protected + "/")
