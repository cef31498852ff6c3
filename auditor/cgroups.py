"""Which pod and container a process belongs to, read from the text of ``/proc/<pid>/cgroup``.

The kubelet names a pod's cgroup ``pod<uid>`` (cgroupfs driver) or ``kubepods[-<qos>]-pod<uid_>.slice`` (systemd
driver, ``-`` escaped to ``_``); the runtime puts each container in a child of it: ``cri-containerd-<id>.scope``,
``crio-<id>.scope`` or ``docker-<id>.scope`` under systemd, ``<id>`` or ``crio-<id>`` under cgroupfs
(the kubelet's ``cm/cgroup_manager_linux.go`` and the runtimes' cgroup naming). The path is not anchored at
``/kubepods``: custom ``--cgroup-root`` values, kind's ``/kubelet.slice/kubelet-kubepods.slice`` and the ``/../..``
prefixes a reader in a private cgroup namespace sees all occur. It is anchored on the kubelet's own layout instead:

- the **outermost** pod component wins. Below a container's cgroup the container itself may make cgroups (systemd
  inside, nested runtimes, a nested cluster), and name them as it likes: a process that moves into
  ``.../cri-containerd-<its id>.scope/kubepods/pod<another uid>/<an id>`` is still in its own container. Such a
  path names two pods: ``nested_pod_uid`` keeps the inner one, so that the auditor reports it;
- a pod component counts only where the kubelet puts one: ``pod<uid>`` right under ``kubepods`` or a QoS class
  (``burstable``, ``besteffort``), ``<parent>-pod<uid_>.slice`` right under ``<parent>.slice`` (systemd names a
  slice after its parent), or right after the ``..`` of a cgroup namespace;
- the container is the component right below the pod, so processes in sub-cgroups a container makes for itself
  still map to it.

Pure: the host /proc adapter (``auditor.hostproc``) does the reading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTAINERD = "containerd"
CRIO = "cri-o"
DOCKER = "docker"

#: Scope/directory prefix of a container cgroup → the runtime that made it (kubelet ``SystemdPathPrefixOfRuntime``).
_RUNTIME_PREFIXES = {"cri-containerd": CONTAINERD, "crio": CRIO, "docker": DOCKER}
#: Prefixes of cgroups that hold runtime helpers, not containers: CRI-O's conmon monitor (cadvisor skips it too).
_NOT_CONTAINERS = frozenset({"crio-conmon"})

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# A pod component: "pod<uid>" (cgroupfs) or "<parents>-pod<uid_>.slice" (systemd). Static pods have 32-hex
# uids (the config hash) without dashes.
_POD = re.compile(rf"^(?:(?P<parents>.*)-)?pod(?P<uid>{_UID})(?P<slice>\.slice)?$")
#: What the kubelet's cgroupfs layout puts right above ``pod<uid>``: the pods' parent or a QoS class.
_CGROUPFS_POD_PARENTS = frozenset({"kubepods", "burstable", "besteffort"})
#: Parents any layout may show: the top of the path, and the ``..`` of a reader in a private cgroup namespace.
_ANY_LAYOUT_PARENTS = frozenset({"", ".."})
_CONTAINER = re.compile(r"^(?:(?P<prefix>[a-z0-9_.-]+?)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")

# v1 hierarchies in order of preference: these are always mounted and always follow the pod layout;
# ``name=systemd`` is managed by systemd itself and is the least trustworthy.
_CONTROLLER_RANK = ("memory", "pids", "cpu", "cpuacct", "devices", "")


@dataclass(frozen=True)
class CgroupIdentity:
    """The pod (by UID, dashed form as in ``metadata.uid``) and container a process runs in.

    ``container_id`` is the runtime's 64-hex id, as in ``status.containerStatuses[].containerID`` after the
    ``<runtime>://`` prefix; None when the process sits in the pod cgroup itself. Pause/sandbox containers are
    reported like any other: they are not in PodResources, and the audit decides what that means. Static pods
    carry their config hash here, which the API shows as the mirror pod's ``kubernetes.io/config.mirror``
    annotation rather than its ``metadata.uid``. ``runtime`` is None where the layout does not tell
    (cgroupfs containerd and docker both use a bare id).
    """

    pod_uid: str
    container_id: str | None
    runtime: str | None
    #: a second pod named below this one, in cgroups the container made itself: reported, never believed
    nested_pod_uid: str | None = None


def _where_the_kubelet_puts_pods(pod: re.Match[str], parent: str) -> bool:
    """Whether a pod component sits where the kubelet's layout puts one, under ``parent``."""
    if parent in _ANY_LAYOUT_PARENTS:
        return True
    if pod["slice"]:  # systemd: "<p>-pod<uid_>.slice" is a child of "<p>.slice"
        return pod["parents"] is not None and parent == f"{pod['parents']}.slice"
    return pod["parents"] is None and parent in _CGROUPFS_POD_PARENTS


def _uid(pod: re.Match[str]) -> str:
    return pod["uid"].replace("_", "-")


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """The identity one cgroup path names, or None for paths outside any pod and for runtime helpers."""
    components = path.split("/")
    for position, component in enumerate(components):  # the outermost pod wins: the kubelet made it
        pod = _POD.match(component)
        if pod is None or not _where_the_kubelet_puts_pods(pod, components[position - 1] if position else ""):
            continue
        uid = _uid(pod)
        below = (_uid(inner) for inner in map(_POD.match, components[position + 1 :]) if inner)
        nested = next((other for other in below if other != uid), None)
        if position + 1 == len(components) or not components[position + 1]:
            return CgroupIdentity(uid, None, None, nested)
        container = _CONTAINER.match(components[position + 1])
        if container is None:
            return CgroupIdentity(uid, None, None, nested)
        prefix = container["prefix"]
        if prefix in _NOT_CONTAINERS:
            return None
        runtime = _RUNTIME_PREFIXES.get(prefix) if prefix else None
        return CgroupIdentity(uid, container["id"], runtime, nested)
    return None


def _rank(controllers: str) -> int:
    if controllers.startswith("name="):
        return len(_CONTROLLER_RANK) + 1
    names = controllers.split(",")
    for rank, controller in enumerate(_CONTROLLER_RANK):
        if controller in names:
            return rank
    return len(_CONTROLLER_RANK)


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """The identity in the content of ``/proc/<pid>/cgroup``; None when the process is not in a pod container.

    Lines are ``<hierarchy>:<controllers>:<path>``: one ``0::<path>`` line on cgroup v2; one line per hierarchy
    on v1 and hybrid hosts. Every line is read on its own (identities are never mixed across hierarchies) and
    the best one wins: a line naming a container over one naming only the pod, then the preferred controller.
    """
    best: tuple[tuple[bool, int], CgroupIdentity] | None = None
    for line in text.splitlines():
        fields = line.strip().split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        identity = parse_cgroup_path(path)
        if identity is None:
            continue
        key = (identity.container_id is not None, -_rank(controllers))
        if best is None or key > best[0]:
            best = (key, identity)
    return best[1] if best else None
