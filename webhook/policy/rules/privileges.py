"""The rules of what a pod may do on the node that holds the GPUs: run privileged, add capabilities, run as a Windows
host process, share the node's PID or IPC namespace. Each guards the node (``Reach.NODE``): with
``gpu_node_taints`` they judge only pods that can land on a GPU node, and a rejection names the exemption for a
trusted node agent (``webhook.ways_out``).

The four rules that read the containers' security contexts share one pass over them
(:func:`~webhook.policy.pod.security_contexts`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gpu_fence.vocabulary import has_resource_claims, requests_device_plugin_gpu

from ...config import SHARED_NAMESPACE_CAPABILITIES, SYS_ADMIN_CAPABILITIES, SharedNamespace, Switch, capability_name
from ..pod import (
    ContainerView,
    PodView,
    flag,
    in_container,
    kai_fraction_name,
    mapping,
    security_contexts,
    spec_containers,
)
from ..registry import Reach, rule
from ..values import RuleId, Violation, quote


@rule(
    RuleId.PRIVILEGED,
    "a privileged container sees every device of the node, GPUs included",
    vectors=("V6",),
    reach=Reach.NODE,
)
def privileged(pod: PodView) -> list[Violation]:
    found: list[Violation] = []
    for container in security_contexts(pod).privileged:
        found.append(
            in_container(
                RuleId.PRIVILEGED,
                container,
                "is privileged and sees every device of the node, GPUs included",
                "remove securityContext.privileged and add only the capabilities it needs (allowed_capabilities); "
                "request nvidia.com/gpu for a GPU",
            )
        )
    return found


@rule(
    RuleId.SYS_ADMIN_CAPABILITY,
    "capabilities.add with SYS_ADMIN or ALL, which the NVIDIA toolkit treats as privileged",
    vectors=("V7",),
    reach=Reach.NODE,
)
def sys_admin_capability(pod: PodView) -> list[Violation]:
    found: list[Violation] = []
    for container, added in security_contexts(pod).capability_additions:
        # Runtimes upper-case names and add the CAP_ prefix themselves, so "cap_sys_admin" is SYS_ADMIN too.
        for capability in added:
            if capability_name(capability) in SYS_ADMIN_CAPABILITIES:
                found.append(
                    in_container(
                        RuleId.SYS_ADMIN_CAPABILITY,
                        container,
                        f"adds capability {quote(capability)}, which the NVIDIA toolkit treats as privileged",
                        f"remove {quote(capability)} from securityContext.capabilities.add",
                    )
                )
                break
    return found


@rule(
    RuleId.ADDED_CAPABILITY,
    "capabilities.add with a capability not on the allowlist (DAC_READ_SEARCH, SYS_MODULE, SYS_RAWIO, BPF, "
    "PERFMON, SYS_TIME and every other one that reaches the node), or NET_ADMIN or NET_RAW with hostNetwork, or "
    "SYS_PTRACE with shareProcessNamespace",
    vectors=("V18",),
    reach=Reach.NODE,
)
def added_capability(pod: PodView) -> list[Violation]:
    """Every added capability must be on the allowlist; and those that reach past the pod once it shares a namespace
    (``SHARED_NAMESPACE_CAPABILITIES``) must not meet that namespace."""
    allowed = pod.config.allowed_capability_set
    found: list[Violation] = []
    for container, added in security_contexts(pod).capability_additions:
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
                quoted = ", ".join(quote(c) for c in listed)
                fix = f"remove {quoted} from securityContext.capabilities.add" + (f", or {unshare}" if unshare else "")
                found.append(in_container(RuleId.ADDED_CAPABILITY, container, f"adds capability {quoted}{why}", fix))
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


def _shared_namespaces(pod: PodView, container: ContainerView) -> list[SharedNamespace]:
    """The namespaces this container shares in which :data:`SHARED_NAMESPACE_CAPABILITIES` reach further: the
    node's network, and a PID namespace that holds another container that gets a GPU (the pod's, with
    ``shareProcessNamespace``; for a debug container, its target's, with ``targetContainerName``). Read only for a
    container that adds capabilities."""
    shared: list[SharedNamespace] = []
    spec = pod.spec
    if flag(spec.get("hostNetwork")):
        shared.append(SharedNamespace.HOST_NETWORK)
    target = container.body.get("targetContainerName") if container.field == "ephemeralContainers" else None
    if target:
        sharers: Collection[Any] = (target,)
    elif flag(spec.get("shareProcessNamespace")):
        sharers = [body.get("name") for body in spec_containers(spec) if body.get("name") != container.name]
    else:
        sharers = ()
    if sharers and any(_gets_gpu(pod, name) for name in sharers):
        shared.append(SharedNamespace.SHARE_PROCESS_NAMESPACE)
    return shared


def _gets_gpu(pod: PodView, name: Any) -> bool:
    """Whether the spec's container of that name gets a GPU: a device-plugin request, a DRA claim (of any class:
    counted, to be safe) or KAI's fraction. A name that names no readable container counts too (fail closed)."""
    bodies = [body for body in spec_containers(pod.spec) if body.get("name") == name]
    if not bodies or not isinstance(name, str):
        return True
    kai_name = kai_fraction_name({"metadata": pod.metadata, "spec": pod.spec}, pod.config)
    return any(
        requests_device_plugin_gpu(body, pod.config.gpu_resource_set) or has_resource_claims(body) or name == kai_name
        for body in bodies
    )


@rule(
    RuleId.HOST_PROCESS,
    "windowsOptions.hostProcess on the pod or a container: a Windows HostProcess container runs on the node as a "
    "host process",
    vectors=("V29",),
    reach=Reach.NODE,
)
def host_process(pod: PodView) -> list[Violation]:
    found: list[Violation] = []
    security = pod.spec.get("securityContext")
    options = mapping(security).get("windowsOptions") if security else None
    if pod.whole_pod and options and mapping(options).get("hostProcess") is True:
        found.append(
            Violation(
                RuleId.HOST_PROCESS,
                None,
                "the pod sets securityContext.windowsOptions.hostProcess, which runs its containers as processes "
                "of the Windows node with its devices and files",
                "remove securityContext.windowsOptions.hostProcess",
            )
        )
    for container in security_contexts(pod).host_processes:
        found.append(
            in_container(
                RuleId.HOST_PROCESS,
                container,
                "sets securityContext.windowsOptions.hostProcess, which runs it as a process of the Windows node "
                "with its devices and files",
                "remove securityContext.windowsOptions.hostProcess",
            )
        )
    return found


@rule(
    RuleId.HOST_PID,
    "hostPID: the pod's processes see, signal and inspect every process of the node",
    vectors=("V19",),
    reach=Reach.NODE,
)
def host_pid(pod: PodView) -> list[Violation]:
    if not pod.whole_pod:  # immutable: judged when the pod was created
        return []
    if flag(pod.spec.get("hostPID")):
        return [
            Violation(
                RuleId.HOST_PID,
                None,
                "the pod shares the node's PID namespace (hostPID), where its processes see, signal and inspect "
                "(environment, files) other pods' processes, GPU jobs included",
                "remove hostPID",
            )
        ]
    return []


def shares_host_ipc(pod: PodView) -> bool:
    """Whether the pod shares the node's IPC namespace; judged when the pod is created (it is immutable)."""
    return pod.whole_pod and flag(pod.spec.get("hostIPC"))


HOST_IPC_FIX = "remove hostIPC (an emptyDir with medium Memory at /dev/shm serves the pod's own processes)"


@rule(
    RuleId.HOST_IPC,
    "hostIPC: the pod joins the node's IPC namespace and gets the node's /dev/shm writable (a warning with "
    "host_ipc: warn)",
    vectors=("V30",),
    reach=Reach.NODE,
)
def host_ipc(pod: PodView) -> list[Violation]:
    if not pod.spec.get("hostIPC") or not shares_host_ipc(pod) or pod.config.host_ipc is not Switch.REJECT:
        return []
    return [
        Violation(
            RuleId.HOST_IPC,
            None,
            "the pod shares the node's IPC namespace (hostIPC), where the runtime mounts the node's /dev/shm writable "
            "into it and other hostIPC pods' shared memory (NCCL's among them) is open to it",
            HOST_IPC_FIX,
        )
    ]
