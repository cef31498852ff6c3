"""The rules of what reaches the node: privileges, capabilities, the node's namespaces, host processes."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from gpu_fence.vocabulary import has_resource_claims, requests_device_plugin_gpu

from ...config import SHARED_NAMESPACE_CAPABILITIES, SYS_ADMIN_CAPABILITIES, SharedNamespace, capability_name
from ..pod import _Container, _in_container, _kai_fraction_name, _mapping, _Pod
from ..values import (
    _REJECT,
    ADDED_CAPABILITY,
    HOST_IPC,
    HOST_PID,
    HOST_PROCESS,
    PRIVILEGED,
    SYS_ADMIN_CAPABILITY,
    Violation,
    _quote,
)


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
