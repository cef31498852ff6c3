"""The rules of mounts and volumes: a mount where the toolkit reads a device list, hostPath volumes (the protected
paths that reach the node, and an allowlist for the rest) and volume types the kubelet sets up on the node.

The three volume rules share one pass over the volumes, which keeps those with a key beyond ``name`` and the allowed
types (nearly every pod has none), and the two hostPath rules one over the hostPath volumes
(:func:`~webhook.policy.pod.other_volumes`, :func:`~webhook.policy.pod.host_path_volumes`).
"""

from __future__ import annotations

from gpu_fence.vocabulary import DEVICE_LIST_MOUNT_PREFIXES

from ...config import HOST_PATH_VOLUME
from ...host_paths import clean_path
from ..pod import PodView, host_path_volumes, in_container, other_volumes, volume_mounts
from ..registry import Reach, rule
from ..values import RuleId, Violation, quote


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


@rule(
    RuleId.DEVICE_LIST_MOUNT,
    "a volumeMount under /var/run/nvidia-container-devices, which the toolkit reads as a device list",
    vectors=("V8",),
)
def device_list_mount(pod: PodView) -> list[Violation]:
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
                    in_container(
                        RuleId.DEVICE_LIST_MOUNT,
                        container,
                        f"mounts a volume at {quote(path)}, which the NVIDIA toolkit reads as a GPU request",
                        f"remove the volumeMount at {quote(path)} and request nvidia.com/gpu",
                    )
                )
    return found


@rule(
    RuleId.HOST_DEVICE_PATH,
    "a hostPath volume at or above GPU device nodes, CDI specs, the driver or toolkit, the kubelet, runtime "
    "sockets and storage, /proc or /sys",
    vectors=("V11",),
    reach=Reach.NODE,
)
def host_device_path(pod: PodView) -> list[Violation]:
    return [
        Violation(
            RuleId.HOST_DEVICE_PATH,
            None,
            f"volume {quote(name)} mounts host path {quote(path)}, which exposes {reached}",
            f"replace hostPath volume {quote(name)} with another volume type (request nvidia.com/gpu for a GPU)",
        )
        for name, path, _, reached in host_path_volumes(pod)
        if reached is not None
    ]


def _writable_volumes(pod: PodView) -> set[str]:
    """Names of the volumes that a container under judgement mounts without ``readOnly: true``."""
    return {
        mount["name"]
        for container in pod.containers
        for mount in volume_mounts(container)
        if isinstance(mount.get("name"), str) and mount.get("readOnly") is not True
    }


@rule(
    RuleId.HOST_PATH,
    "a hostPath volume that is not on the allowlist, or mounted writable where its entry is read-only",
    vectors=("V17",),
    reach=Reach.NODE,
)
def host_path(pod: PodView) -> list[Violation]:
    """Every hostPath that ``host-device-path`` does not already reject must be on the allowlist, exactly (its
    sub-paths are not: see docs/policy.md), and mounted read-only unless its entry allows writes."""
    allowlist = pod.config.host_path_writable
    found: list[Violation] = []
    writable: set[str] | None = None
    for name, path, cleaned, reached in host_path_volumes(pod):
        if reached is not None:  # host-device-path's
            continue
        allowed = allowlist.get(cleaned)
        if allowed is None:
            found.append(
                Violation(
                    RuleId.HOST_PATH,
                    None,
                    f"volume {quote(name)} mounts host path {quote(path)}, which is not on the hostPath "
                    "allowlist (host_path_allowlist)",
                    f"replace hostPath volume {quote(name)} with another volume type, or ask for an allowlist entry",
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
                    RuleId.HOST_PATH,
                    None,
                    f"volume {quote(name)} mounts host path {quote(path)} writable, which the hostPath allowlist "
                    "allows read-only",
                    f"set readOnly: true on every volumeMount of volume {quote(name)}",
                )
            )
    return found


@rule(
    RuleId.VOLUME_TYPE,
    "a volume whose type is not on the allowlist (gitRepo, fc, iscsi, nfs and every other type the kubelet sets up "
    "on the node from what the pod says)",
    vectors=("V28",),
    reach=Reach.NODE,
)
def volume_type(pod: PodView) -> list[Violation]:
    """A volume's type is each of its keys but ``name`` (the API allows one; it defaults a volume with none to
    ``emptyDir``, so none is no violation). Judged at creation only: volumes cannot be added by an update, and an
    ephemeral container that mounts one reuses what the kubelet set up when the pod started."""
    if not pod.whole_pod:
        return []
    others = other_volumes(pod)
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
                    RuleId.VOLUME_TYPE,
                    None,
                    f"volume {quote(volume.get('name'))} is of type {quote(kind)}, which is not on the volume type "
                    "allowlist (allowed_volume_types): the kubelet sets it up on the node from what the pod says",
                    hint,
                )
            )
    return found


_VOLUME_TYPE_HINTS = {
    "gitRepo": "clone the repository in an init container into an emptyDir instead",
}
