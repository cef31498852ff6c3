"""The rules of mounts and volumes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpu_fence.vocabulary import DEVICE_LIST_MOUNT_PREFIXES

from ...config import HOST_PATH_VOLUME
from ...host_paths import clean_path, reaches_protected
from ..pod import _Container, _in_container, _mapping, _Pod
from ..values import DEVICE_LIST_MOUNT, HOST_DEVICE_PATH, HOST_PATH, VOLUME_TYPE, Violation, _quote


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
