"""The ValidatingAdmissionPolicy's CEL agrees with the webhook's Python policy, rule by rule.

The shipped policy text is evaluated as the API server does (``tests/manifests/cel.py``). For every fixture pod and
every rule, CEL denies iff ``gpu_fence.webhook.policy.validate`` reports that rule, under the default configuration
and under configurations that change the keys the policy has variables for (patched as a site would patch them).
The few inputs where CEL must be stricter (paths it cannot clean, a KAI fraction container past the 64th) are
listed separately and asserted to be stricter, not equal.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.webhook.config import (
    DEFAULT_ALLOWED_CAPABILITIES,
    GpuTaint,
    HostPathEntry,
    PolicyConfig,
    Switch,
    TaintEffect,
)
from gpu_fence.webhook.policy import RULES, UPDATE_RULES
from tests.fakes.pods import KAI_PREFIX, as_kai_leaves_it, kai_reference
from tests.fakes.processes import run_captured
from tests.fakes.stacks import StackPod, stack_pods

from .cel import CONFIG_VARIABLES, cel_denials, cel_variables_for, compiled, policy_spec
from .conftest import kubectl, one, render

#: The webhook's rule ids, in its table's order: the CEL policy must have one validation per rule, in that order.
RULE_IDS = tuple(rule.id for rule in RULES)
NVD = "NVIDIA_VISIBLE_DEVICES"
VOID = {"name": NVD, "value": "void"}


@pytest.fixture(autouse=True, scope="module")
def _cheap_error_repr() -> Iterator[None]:
    """cel-python evaluates both sides of ``||`` and, when both are errors, formats their repr into a TypeError;
    that repr dumps the whole activation and dominates the run time. Only the text of that message changes."""

    def short(error: celpy.CELEvalError) -> str:
        first = error.args[0] if error.args else ""
        return f"CELEvalError({first if isinstance(first, str) else type(first).__name__!s:.120})"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(celpy.CELEvalError, "__repr__", short)
        yield


def python_violations(pod: dict[str, Any], config: PolicyConfig | None = None) -> set[str]:
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy import validate

    return {violation.rule for violation in validate(pod, config or load_config(None)).violations}


def python_update_violations(pod: dict[str, Any], old: dict[str, Any]) -> set[str]:
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy import exemption, validate_update

    config = load_config(None)
    if exemption(pod, config, namespace="team-a"):
        return set()
    return {violation.rule for violation in validate_update(pod, old, config).violations}


def container(name: str = "app", *env: dict[str, Any], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "busybox:1.36", **fields}
    if env:
        body["env"] = list(env)
    return body


def gpu(
    name: str = "cuda",
    *env: dict[str, Any],
    resource: str = "nvidia.com/gpu",
    amount: Any = "1",
    section: str = "limits",
    **fields: Any,
) -> dict[str, Any]:
    return container(name, *env, resources={section: {resource: amount}}, **fields)


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "demo", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": list(containers), **spec}}


def nvd(value: str) -> dict[str, Any]:
    return {"name": NVD, "value": value}


def host_path_pod(path: str) -> dict[str, Any]:
    return pod(
        container("app", VOID, volumeMounts=[{"name": "host", "mountPath": "/host"}]),
        volumes=[{"name": "host", "hostPath": {"path": path}}],
    )


def mount_pod(path: str) -> dict[str, Any]:
    return pod(
        container("app", VOID, volumeMounts=[{"name": "data", "mountPath": path}]),
        volumes=[{"name": "data", "emptyDir": {}}],
    )


def caps_pod(*capabilities: str) -> dict[str, Any]:
    return pod(container("app", VOID, securityContext={"capabilities": {"add": list(capabilities)}}))


def kai_pod(*containers: dict[str, Any], scheduler: str = "kai-scheduler", name: str | None = None) -> dict[str, Any]:
    annotations = {"gpu-fraction": "0.5"}
    if name is not None:
        annotations["gpu-fraction-container-name"] = name
    return pod(*containers, annotations=annotations, schedulerName=scheduler)


KAI_ENV = {"name": NVD, "valueFrom": {"configMapKeyRef": {"name": "reservation", "key": "visible-devices"}}}


def kai_left(
    *containers: dict[str, Any], name: str | None = None, prefix: str = KAI_PREFIX, **spec: Any
) -> dict[str, Any]:
    """A KAI fraction pod as KAI's webhook leaves it (the reference in KAI's shape), with extra spec fields."""
    authored = kai_pod(*containers, name=name)
    authored["spec"].update(spec)
    return as_kai_leaves_it(authored, prefix=prefix)


def without_prefix(document: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    del changed["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    return changed


def with_reference(document: dict[str, Any], entry: dict[str, Any], field: str = "containers", index: int = 0):
    changed = copy.deepcopy(document)
    body = changed["spec"][field][index]
    body["env"] = [e for e in body.get("env", []) if e["name"] != NVD] + [entry]
    return changed


def claim_pod(*env: dict[str, Any]) -> dict[str, Any]:
    return pod(
        container("ctr", *env, resources={"claims": [{"name": "c"}]}),
        resourceClaims=[{"name": "c", "resourceClaimTemplateName": "t"}],
    )


def annotated_pod(key: str) -> dict[str, Any]:
    return pod(container("app", VOID), annotations={key: "/dev/nvidia0"})


IMEX = {"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}
GATED = ("NVIDIA_NVSWITCH", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY")
#: One volume of each type the tests judge, by type (the API server's shape: one type per volume).
VOLUMES: dict[str, dict[str, Any]] = {
    "configMap": {"configMap": {"name": "settings"}},
    "csi": {"csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}},
    "downwardAPI": {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    "emptyDir": {"emptyDir": {"medium": "Memory"}},
    "ephemeral": {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    "persistentVolumeClaim": {"persistentVolumeClaim": {"claimName": "data"}},
    "projected": {"projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
    "secret": {"secret": {"secretName": "s"}},
    "image": {"image": {"reference": "registry.example/models:v1"}},
    "gitRepo": {"gitRepo": {"repository": "https://example.com/r.git"}},
    "nfs": {"nfs": {"server": "10.0.0.1", "path": "/datasets"}},
    "fc": {"fc": {"targetWWNs": ["500a0982991b8dc5"], "lun": 2}},
    "iscsi": {"iscsi": {"targetPortal": "10.0.0.2:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}},
    "rbd": {"rbd": {"monitors": ["10.0.0.3:6789"], "image": "foo"}},
    "flexVolume": {"flexVolume": {"driver": "example/lvm"}},
    "cephfs": {"cephfs": {"monitors": ["10.0.0.3:6789"]}},
}


def volume_pod(*types: str) -> dict[str, Any]:
    volumes = [{"name": f"v{index}", **VOLUMES[kind]} for index, kind in enumerate(types)]
    mounts = [{"name": volume["name"], "mountPath": f"/mnt/{volume['name']}"} for volume in volumes]
    return pod(container("app", VOID, volumeMounts=mounts), volumes=volumes)


def host_process(value: bool = True) -> dict[str, Any]:
    return {"windowsOptions": {"hostProcess": value, "runAsUserName": "NT AUTHORITY\\SYSTEM"}}


SIDECAR_TRAINER = pod(
    gpu("trainer", amount="8"),
    initContainers=[container("log-shipper", VOID, restartPolicy="Always")],
    shareProcessNamespace=True,
)
CAPABILITY_CASES = [
    ("IPC_LOCK",),
    ("ipc_lock", "CAP_CHOWN"),
    ("SYS_PTRACE",),
    ("cap_dac_read_search",),
    ("SYS_MODULE", "IPC_LOCK"),
    ("SYS_RAWIO",),
    ("BPF",),
    ("NET_RAW",),
    ("SYS_ADMIN", "SYS_PTRACE"),
    ("IPC_LOCKX",),
    ("XIPC_LOCK",),
    ("SYS_TIME",),
    ("PERFMON",),
    ("NET_ADMIN", "NET_RAW"),
    ("SYS_NICE", "SYS_RESOURCE", "IPC_LOCK"),
    ("CAP_SYS_PTRACE",),
    ("checkpoint_restore",),
]


def ptrace(name: str = "dbg", **fields: Any) -> dict[str, Any]:
    return container(name, VOID, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}, **fields)


def net(capability: str, name: str = "app") -> dict[str, Any]:
    return container(name, VOID, securityContext={"capabilities": {"add": [capability]}})


#: A pod that breaks every rule that guards the node (and one GPU rule, visible-devices-env), to be scoped by
#: gpu_node_taints through its tolerations and scheduling fields.
def taint_pod(tolerations: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body = pod(
        container(
            "app",
            nvd("all"),
            securityContext={"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "SYS_TIME"]}},
            volumeMounts=[{"name": "dev", "mountPath": "/dev-host"}, {"name": "data", "mountPath": "/data"}],
        ),
        annotations={"devices.crio.io": "/dev/nvidia0"},
        hostPID=True,
        volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}, {"name": "data", "hostPath": {"path": "/data"}}],
        **spec,
    )
    if tolerations is not None:
        body["spec"]["tolerations"] = tolerations
    return body


GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
TAINT_FIXTURES: dict[str, dict[str, Any]] = {
    "taint none": taint_pod(),
    "taint empty list": taint_pod([]),
    "taint exact": taint_pod([GPU_TAINT_TOLERATION]),
    "taint no operator": taint_pod([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    "taint exists no key": taint_pod([{"operator": "Exists"}]),
    "taint exists no key NoSchedule": taint_pod([{"operator": "Exists", "effect": "NoSchedule"}]),
    "taint exists key": taint_pod([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
    "taint other effect": taint_pod([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
    "taint wrong value": taint_pod([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]),
    "taint other key": taint_pod([{"key": "dedicated", "operator": "Exists"}]),
    "taint operator Gt": taint_pod([{"key": "nvidia.com/gpu", "operator": "Gt", "value": "1"}]),
    "taint node name": taint_pod(nodeName="gpu-node-1"),
    "taint runtime class": taint_pod(runtimeClassName="gvisor"),
    "taint other scheduler": taint_pod(schedulerName="my-scheduler"),
    "taint default scheduler": taint_pod(schedulerName="default-scheduler"),
    # volume-type, host-process and host-ipc are node rules; bound-gpu-pod and gated-device-env guard GPUs
    "taint node-reaching none": pod(
        container("app", VOID, securityContext={"windowsOptions": {"hostProcess": True}}),
        volumes=[{"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}}],
        hostIPC=True,
    ),
    "taint node-reaching tolerated": pod(
        container("app", VOID, securityContext={"windowsOptions": {"hostProcess": True}}),
        volumes=[{"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}}],
        hostIPC=True,
        tolerations=[GPU_TAINT_TOLERATION],
    ),
    "taint gated device env": pod(gpu("cuda", {"name": "NVIDIA_NVSWITCH", "value": "enabled"})),
    "taint bound gpu pod": pod(gpu("cuda"), nodeName="cpu-node-1"),
}
ANNOTATION_CASES = [
    "io.kubernetes.cri-o.Devices",
    "devices.crio.io/app",
    "devices.noderesource.dev/container.app",
    "cdi-devices.nri.io/pod",
    "mounts.noderesource.dev",
    "example.com/devices.crio.io",
    "sysctl.noderesource.dev/pod",
]

FIXTURES: dict[str, dict[str, Any]] = {
    "plain-unpinned": pod(container()),
    "pinned-void": pod(container("app", VOID)),
    "pinned-none": pod(container("app", nvd("none"))),
    "pinned-empty": pod(container("app", nvd(""))),
    "pinned-no-value": pod(container("app", {"name": NVD})),
    "all": pod(container("app", nvd("all"))),
    "index": pod(container("app", nvd("0"))),
    "uuid": pod(container("app", nvd("GPU-6f2b1a1e-0000-4000-8000-000000000000"))),
    "void-in-list": pod(container("app", nvd("0,void"))),
    "all-then-void": pod(container("app", nvd("all, void"))),
    "none-then-all": pod(container("app", nvd(" none ,all"))),
    "all-then-none": pod(container("app", nvd("all,none"))),
    "only-commas": pod(container("app", nvd(" , ,"))),
    "upper-void": pod(container("app", nvd("VOID"))),
    "allx-then-none": pod(container("app", nvd("allx,al,a l l,none"))),
    "reference": pod(container("app", nvd("$(OTHER)"))),
    "value-from-secret": pod(container("app", {"name": NVD, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})),
    "value-from-field": pod(
        container("app", {"name": NVD, "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['x']"}}})
    ),
    "gpu-and-sidecar": pod(gpu(), container("sidecar")),
    "gpu-and-pinned-sidecar": pod(gpu(), container("sidecar", VOID)),
    "gpu-sets-nvd": pod(gpu("cuda", nvd("all"))),
    "gpu-sets-void": pod(gpu("cuda", nvd("void"))),
    "gpu-zero": pod(gpu(amount="0")),
    "gpu-zero-decimal": pod(gpu(amount="0.0")),
    "gpu-requests-only": pod(gpu(section="requests")),
    "gpu-milli": pod(gpu(amount="500m")),
    "gpu-shared": pod(gpu(resource="nvidia.com/gpu.shared", amount="2")),
    "gpu-mig": pod(gpu(resource="nvidia.com/mig-1g.5gb")),
    "gpu-lookalike": pod(gpu(resource="nvidia.com/gpux")),
    "amd-gpu": pod(gpu(resource="amd.com/gpu")),
    "dra-claim": pod(
        container("cuda", resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}],
    ),
    "kai-fraction": kai_pod(container("main", KAI_ENV), container("sidecar", VOID)),
    "kai-fraction-named": kai_pod(container("sidecar", VOID), container("main", KAI_ENV), name="main"),
    "kai-fraction-wrong-container": kai_pod(container("main", VOID), container("other", KAI_ENV)),
    "kai-other-scheduler": kai_pod(container("main", KAI_ENV), scheduler="default-scheduler"),
    "kai-as-kai-leaves-it": kai_left(container("main"), container("sidecar", VOID)),
    "kai-named-second": kai_left(container("sidecar", VOID), container("main"), name="main"),
    "kai-init-container": kai_left(container("main", VOID), name="loader", initContainers=[container("loader")]),
    "kai-created-bound": kai_left(container("main"), nodeName="gpu-node-1"),
    "kai-empty-node-name": kai_left(container("main"), nodeName=""),
    "kai-other-config-map": with_reference(kai_left(container("main")), kai_reference(name="mine")),
    "kai-wrong-index": with_reference(kai_left(container("main")), kai_reference(index=1)),
    "kai-init-index-on-regular": with_reference(kai_left(container("main")), kai_reference(init=True)),
    "kai-wrong-key": with_reference(kai_left(container("main")), kai_reference(key="GPU_PORTION")),
    "kai-optional": with_reference(kai_left(container("main")), kai_reference(optional=True)),
    "kai-optional-false": with_reference(kai_left(container("main")), kai_reference(optional=False)),
    "kai-reference-with-value": with_reference(kai_left(container("main")), {**kai_reference(), "value": "all"}),
    "kai-prefix-not-kai-shaped": kai_left(container("main"), prefix="my-gpus"),
    "kai-prefix-with-vowels": kai_left(container("main"), prefix="main-aeiou01-shared-gpu"),
    "kai-no-prefix-annotation": without_prefix(kai_left(container("main"))),
    "kai-reference-on-the-sidecar": with_reference(
        kai_left(container("main"), container("sidecar", VOID)), kai_reference(index=1), index=1
    ),
    "kai-fraction-with-gpu-resource": with_reference(kai_pod(gpu("main")), kai_reference()),
    "kai-literal-none": with_reference(kai_left(container("main")), nvd("none")),
    "dra-claim-unpinned": claim_pod(),
    "dra-claim-pinned": claim_pod(VOID),
    "dra-claim-all": claim_pod(nvd("all")),
    "dra-claim-beside-gpu": pod(
        container("ctr", resources={"limits": {"nvidia.com/gpu": "1"}, "claims": [{"name": "c"}]}),
        resourceClaims=[{"name": "c", "resourceClaimTemplateName": "t"}],
    ),
    "none-on-sidecar": pod(gpu(), container("sidecar", nvd(" none"))),
    "env-from-on-gpu": pod(gpu(envFrom=[{"configMapRef": {"name": "settings"}}])),
    "env-from-on-pinned": pod(container("app", VOID, envFrom=[{"configMapRef": {"name": "settings"}}])),
    "env-from-empty-on-gpu": pod(gpu(envFrom=[])),
    "nccl-worker": pod(
        gpu(
            "trainer",
            amount="8",
            securityContext={"capabilities": {"add": ["IPC_LOCK"]}},
            volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
        ),
        hostNetwork=True,
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    ),
    "host-pid": pod(gpu(), hostPID=True),
    "host-pid-false": pod(gpu(), hostPID=False),
    "imex-channels": pod(gpu("cuda", IMEX)),
    "imex-channels-from": pod(
        container("app", VOID, {"name": "NVIDIA_IMEX_CHANNELS", "valueFrom": {"fieldRef": {"fieldPath": "x"}}})
    ),
    "init-imex": pod(container("app", VOID), initContainers=[container("i", VOID, IMEX)]),
    **{f"gated {name}": pod(gpu("cuda", {"name": name, "value": "enabled"})) for name in GATED},
    "gated on a pinned container": pod(container("app", VOID, {"name": "NVIDIA_GDS", "value": "disabled"})),
    "gated init": pod(gpu(), initContainers=[container("i", VOID, {"name": "NVIDIA_NVSWITCH", "value": "enabled"})]),
    "gated ephemeral": pod(
        gpu(), ephemeralContainers=[container("debug", VOID, {"name": "NVIDIA_MOFED", "value": "enabled"})]
    ),
    "gated lookalike": pod(gpu("cuda", {"name": "NVIDIA_GDS_VERSION", "value": "1"})),
    "bound gpu": pod(gpu(), nodeName="gpu-node-1"),
    "bound gpu shared": pod(gpu(resource="nvidia.com/gpu.shared", amount="2"), nodeName="gpu-node-1"),
    "bound mig init": pod(
        container("app", VOID), initContainers=[gpu("warm", resource="nvidia.com/mig-1g.10gb")], nodeName="n"
    ),
    "bound gpu zero": pod(gpu("cuda", VOID, amount="0"), nodeName="gpu-node-1"),
    "bound cpu": pod(container("app", VOID), nodeName="cpu-node-1"),
    "bound empty node name": pod(gpu(), nodeName=""),
    "node selector gpu": pod(gpu(), nodeSelector={"kubernetes.io/hostname": "gpu-node-1"}),
    **{f"volume {kind}": volume_pod(kind) for kind in VOLUMES},
    "volume all allowed": volume_pod(
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"
    ),
    "volume gitRepo beside allowed": volume_pod("secret", "gitRepo", "emptyDir"),
    "host-process pod": pod(container("app", VOID), securityContext=host_process(), hostNetwork=True),
    "host-process pod false": pod(container("app", VOID), securityContext=host_process(False)),
    "host-process container": pod(container("app", VOID, securityContext=host_process()), hostNetwork=True),
    "host-process init": pod(
        container("app", VOID), initContainers=[container("i", VOID, securityContext=host_process())]
    ),
    "host-process ephemeral": pod(
        container("app", VOID), ephemeralContainers=[container("debug", VOID, securityContext=host_process())]
    ),
    "host-process windows options without it": pod(
        container("app", VOID, securityContext={"windowsOptions": {"runAsUserName": "ContainerUser"}})
    ),
    "host-ipc": pod(gpu(), hostIPC=True),
    "host-ipc-false": pod(gpu(), hostIPC=False),
    # Must stay admitted: GPU quantities in other spellings, a GPU pod without user namespace sharing, a trainer
    # with a native sidecar and a shared process namespace, a LeaderWorkerSet's CPU leader and GPU worker.
    "gpu 1000m": pod(gpu(amount="1000m")),
    "gpu 1e0": pod(gpu(amount="1e0")),
    "gpu host-users false": pod(gpu(), hostUsers=False),
    "gpu trainer with native sidecar and shared pids": SIDECAR_TRAINER,
    "lws leader cpu": pod(container("leader", VOID), subdomain="lws"),
    "lws worker gpu": pod(gpu("worker", amount="8"), subdomain="lws"),
    **{f"caps {' '.join(caps)}": caps_pod(*caps) for caps in CAPABILITY_CASES},
    **{f"annotation {key}": annotated_pod(key) for key in ANNOTATION_CASES},
    "init-caps": pod(
        container("app", VOID),
        initContainers=[container("i", VOID, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}})],
    ),
    "privileged": pod(container("app", VOID, securityContext={"privileged": True})),
    "not-privileged": pod(container("app", VOID, securityContext={"privileged": False})),
    "sys-admin": caps_pod("SYS_ADMIN"),
    "cap-sys-admin-lower": caps_pod("cap_sys_admin"),
    "cap-all": caps_pod("NET_ADMIN", "ALL"),
    "net-admin": caps_pod("NET_ADMIN"),
    "device-mount": mount_pod("/var/run/nvidia-container-devices/all"),
    "device-mount-run": mount_pod("/run/nvidia-container-devices/0"),
    "device-mount-no-boundary": mount_pod("/var/run/nvidia-container-devicesall"),
    "device-mount-unclean": mount_pod("//var/./run//nvidia-container-devices/all"),
    "device-mount-backstep": mount_pod("/var/run/../var/run/nvidia-container-devices/0"),
    "device-mount-elsewhere": mount_pod("/data/nvidia-container-devices"),
    "device-mount-lookalike": mount_pod("/data/my-nvidia-container-devices"),
    "device-mount-relative": mount_pod("nvidia-container-devices/all"),
    "cdi-annotation": pod(container("app", VOID), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
    "nri-annotation": pod(container("app", VOID), annotations={"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0"}),
    "harmless-annotation": pod(container("app", VOID), annotations={"example.com/cdi.k8s.io": "x"}),
    "mirror-pod": pod(container(), annotations={"kubernetes.io/config.mirror": "abc"}),
    "host-network-net-admin": pod(
        gpu("cuda", securityContext={"capabilities": {"add": ["NET_ADMIN"]}}), hostNetwork=True
    ),
    "host-network-init-net-raw": pod(gpu(), initContainers=[net("cap_net_raw", "i")], hostNetwork=True),
    "host-network-false-net-admin": pod(net("NET_ADMIN"), hostNetwork=False),
    "shared-ptrace-gpu-sibling": pod(gpu("trainer"), ptrace(), shareProcessNamespace=True),
    "shared-ptrace-init-debugger": pod(gpu("trainer"), initContainers=[ptrace()], shareProcessNamespace=True),
    "shared-ptrace-no-gpu": pod(container("web", VOID), ptrace(), shareProcessNamespace=True),
    "shared-ptrace-in-the-gpu-container": pod(
        gpu("trainer", securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}),
        container("log", VOID),
        shareProcessNamespace=True,
    ),
    "shared-ptrace-claims-sibling": pod(
        container("claims", VOID, resources={"claims": [{"name": "g"}]}),
        ptrace(),
        shareProcessNamespace=True,
        resourceClaims=[{"name": "g", "resourceClaimTemplateName": "t"}],
    ),
    "unshared-ptrace": pod(gpu("trainer"), ptrace()),
    **TAINT_FIXTURES,
    "mig-config": pod(container("app", VOID, {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"})),
    "mig-monitor": pod(container("app", VOID, {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})),
    "init-unpinned": pod(container("app", VOID), initContainers=[container("init")]),
    "init-all": pod(container("app", VOID), initContainers=[container("init", nvd("all"))]),
    "sidecar-gpu-init": pod(container("app", VOID), initContainers=[gpu("init-gpu", restartPolicy="Always")]),
    "init-privileged": pod(
        container("app", VOID), initContainers=[container("init", VOID, securityContext={"privileged": True})]
    ),
    "ephemeral-unpinned": pod(container("app", VOID), ephemeralContainers=[container("debug")]),
    "ephemeral-all": pod(container("app", VOID), ephemeralContainers=[container("debug", nvd("all"))]),
    "ephemeral-pinned": pod(container("app", VOID), ephemeralContainers=[container("debug", VOID)]),
    "ephemeral-sys-admin": pod(
        container("app", VOID),
        ephemeralContainers=[container("debug", VOID, securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})],
    ),
    "ephemeral-device-mount": pod(
        container("app", VOID),
        ephemeralContainers=[
            container("debug", VOID, volumeMounts=[{"name": "d", "mountPath": "/run/nvidia-container-devices/all"}])
        ],
        volumes=[{"name": "d", "emptyDir": {}}],
    ),
    "ephemeral-mig": pod(
        container("app", VOID),
        ephemeralContainers=[container("debug", VOID, {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})],
    ),
    **{
        f"host-path {path}": host_path_pod(path)
        for path in (
            "/",
            "/dev",
            "/dev/",
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/shm",
            "/dev/fuse",
            "/dev/dri/card0",
            "/var",
            "/var/run",
            "/var/lib/kubelet",
            "/var/lib/kubelet/pods",
            "/var/lib/kubelet/pod-resources/",
            "/run/nvidia/driver",
            "/run/nvidia-persistenced",
            "/etc/cdi",
            "/etc/cdi/nvidia.yaml",
            "/etc",
            "/etc/ssl",
            "/var/run/docker.sock",
            "/run/containerd/containerd.sock",
            "/run/crio",
            "/data",
            "/data/",
            "/opt/models",
            "/home/user/dev",
            "/proc",
            "/proc/1/root",
            "/proc/self/root/",
            "/proc/42/cwd",
            "/sys",
            "/sys/fs/cgroup",
            "/etc/kubernetes/manifests",
            "/etc/nvidia-container-runtime/config.toml",
            "/usr/local/nvidia",
            "/usr",
            "/etc/containerd",
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs",
            "/procfs",
            "/dev/infiniband",
            "/tmp/nvidia-mps",
        )
    },
}

#: Inputs the API server would pass but CEL cannot clean like the webhook does: the VAP denies them outright.
CEL_STRICTER: dict[str, tuple[dict[str, Any], str]] = {
    "host-path with a '.' segment": (host_path_pod("/data/./models"), "host-device-path"),
    "host-path with '//'": (host_path_pod("/data//models"), "host-device-path"),
    "host-path that is relative": (host_path_pod("data"), "host-device-path"),
    "mount path with '..' naming the device dir": (
        mount_pod("/var/run/nvidia-container-devices/../x"),
        "device-list-mount",
    ),
    "KAI fraction container past the 64th": (
        kai_left(*(container(f"side{i}", VOID) for i in range(64)), container("main"), name="main"),
        "visible-devices-env",
    ),
}


@cache
def default_denials(name: str) -> frozenset[str]:
    """CEL's answer for a fixture under the shipped policy, evaluated once per run (two tests read it)."""
    return frozenset(cel_denials(FIXTURES[name]))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_cel_denies_exactly_what_the_python_policy_reports(name: str) -> None:
    fixture = FIXTURES[name]
    expected = set() if name == "mirror-pod" else python_violations(fixture)  # mirror pods are exempt in both
    assert default_denials(name) == expected


def test_fixtures_exercise_every_rule_both_ways() -> None:
    denied = [default_denials(name) for name in FIXTURES]
    denied += [cel_denials(FIXTURES[name], config=CONFIGS[key]) for key, name in CONFIGURED]
    for rule in RULE_IDS:
        if rule not in UPDATE_RULES:  # only an UPDATE can break those: test_kai_update_fixtures_deny_and_allow
            assert any(rule in d for d in denied), f"no fixture triggers {rule}"
    assert any(not d for d in denied)


def test_the_round_3_fixtures_deny_and_allow() -> None:
    """Parity alone would pass if both sides were wrong alike: what each new rule must say about its fixtures."""
    for name in GATED:
        assert default_denials(f"gated {name}") == {"gated-device-env"}
    assert default_denials("gated lookalike") == set()
    for name in ("bound gpu", "bound gpu shared", "bound mig init"):
        assert default_denials(name) == {"bound-gpu-pod"}, name
    for name in ("bound gpu zero", "bound cpu", "bound empty node name", "node selector gpu"):
        assert default_denials(name) == set(), name
    for kind in ("gitRepo", "nfs", "fc", "iscsi", "rbd", "flexVolume", "cephfs"):
        assert default_denials(f"volume {kind}") == {"volume-type"}, kind
    allowed = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected")
    for kind in (*allowed, "secret", "image"):
        assert default_denials(f"volume {kind}") == set(), kind
    for name in ("pod", "container", "init", "ephemeral"):
        assert default_denials(f"host-process {name}") == {"host-process"}, name
    assert default_denials("host-ipc") == {"host-ipc"} and default_denials("host-ipc-false") == set()
    must_stay_admitted = (
        "gpu 1000m",
        "gpu 1e0",
        "gpu host-users false",
        "gpu trainer with native sidecar and shared pids",
        "lws leader cpu",
        "lws worker gpu",
    )
    for name in must_stay_admitted:
        assert default_denials(name) == set(), name
    assert cel_denials(FIXTURES["volume nfs"], config=CONFIGS["volumes"]) == set()
    assert cel_denials(FIXTURES["volume image"], config=CONFIGS["volumes"]) == {"volume-type"}
    assert cel_denials(FIXTURES["host-ipc"], config=CONFIGS["host-ipc-warn"]) == set()


def test_a_volume_type_newer_than_the_policy_is_read_as_image() -> None:
    """CEL names each type of the 1.30 Volume; one it cannot name (``image``, or a type added after this text) is
    judged as ``image``. The webhook judges the type by its name (docs/cel-policy.md)."""
    future = pod(container("app", VOID), volumes=[{"name": "v", "someFutureType": {}}])
    assert cel_denials(future) == set() and python_violations(future) == {"volume-type"}
    no_image = PolicyConfig(allowed_volume_types=("emptyDir",))
    assert cel_denials(future, config=no_image) == {"volume-type"} == python_violations(future, no_image)


# The configuration variables: one per key of policy.yaml that a site is expected to change. At their shipped
# values they are the webhook's defaults; patched (as docs/cel-policy.md shows), CEL still agrees with the webhook.

CONFIGS: dict[str, PolicyConfig] = {
    "allowlist": PolicyConfig(
        host_path_allowlist=(
            HostPathEntry("/dev/infiniband"),
            HostPathEntry("/tmp/nvidia-mps", writable=True),
            HostPathEntry("/data"),
        )
    ),
    "capabilities": PolicyConfig(allowed_capabilities=(*DEFAULT_ALLOWED_CAPABILITIES, "SYS_TIME", "PERFMON")),
    "no-capabilities": PolicyConfig(allowed_capabilities=()),
    "prefixes": PolicyConfig(forbidden_annotation_prefixes=("example.com/devices", "sysctl.noderesource.dev")),
    "switches": PolicyConfig(env_from_on_gpu_containers=Switch.REJECT, visible_devices_none=Switch.REJECT),
    "taints": PolicyConfig(
        gpu_node_taints=(GpuTaint("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE),),
        taint_aware_schedulers=("default-scheduler", "kai-scheduler"),
    ),
    "volumes": PolicyConfig(
        allowed_volume_types=("configMap", "secret", "emptyDir", "projected", "persistentVolumeClaim", "nfs")
    ),
    "host-ipc-warn": PolicyConfig(host_ipc=Switch.WARN),
}
#: Fixtures built to meet the configured keys, judged under every configuration.
CONFIGURED_FIXTURES: dict[str, dict[str, Any]] = {
    "ib": host_path_pod("/dev/infiniband"),
    "ib trailing slash": host_path_pod("/dev/infiniband/"),
    "mps": host_path_pod("/tmp/nvidia-mps"),
    "data": host_path_pod("/data"),
    "data sub-path": host_path_pod("/data/models"),
}


def read_only(document: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for body in changed["spec"].get(field, []):
            for mount in body.get("volumeMounts", []):
                mount["readOnly"] = True
    return changed


CONFIGURED_FIXTURES.update({f"{name}, read-only": read_only(f) for name, f in list(CONFIGURED_FIXTURES.items())})
IB_MOUNT = {"name": "host", "mountPath": "/ib"}
CONFIGURED_FIXTURES["ib read-only, an init container writable"] = read_only(host_path_pod("/dev/infiniband"))
CONFIGURED_FIXTURES["ib read-only, an init container writable"]["spec"]["initContainers"] = [
    container("init", VOID, volumeMounts=[IB_MOUNT])
]
CONFIGURED_FIXTURES["ib read-only, a debug container writable"] = read_only(host_path_pod("/dev/infiniband"))
CONFIGURED_FIXTURES["ib read-only, a debug container writable"]["spec"]["ephemeralContainers"] = [
    container("debug", VOID, volumeMounts=[IB_MOUNT])
]
#: Which shared fixtures each configuration changes the judgement of (by name): the rest would only repeat the
#: default-configuration parity test above at the price of a CEL evaluation each.
RELEVANT = {
    "allowlist": ("host-path",),
    "capabilities": ("caps", "init-caps", "nccl", "sys-admin", "cap-", "net-admin", "ephemeral-sys-admin", "host-n"),
    "no-capabilities": ("caps", "init-caps", "nccl"),
    "prefixes": ("annotation", "cdi", "nri", "harmless", "mirror"),
    "switches": ("none", "env-from", "kai", "dra", "pinned", "void", "all", "gpu", "init", "ephemeral", "upper"),
    "taints": ("taint", "privileged", "host-pid", "nccl", "shared-ptrace"),
    "volumes": ("volume", "nccl", "host-path /dev/shm"),
    "host-ipc-warn": ("host-ipc", "host-pid"),
}
#: (configuration, fixture) pairs that the configuration changes from the default (each asserted to change).
CONFIGURED = [
    ("allowlist", "host-path /tmp/nvidia-mps"),
    ("capabilities", "caps SYS_TIME"),
    ("taints", "taint none"),
    ("taints", "taint other effect"),
    ("taints", "taint node-reaching none"),
    ("prefixes", "annotation sysctl.noderesource.dev/pod"),
    ("switches", "none-on-sidecar"),
    ("switches", "env-from-on-gpu"),
    ("switches", "kai-literal-none"),
    ("no-capabilities", "caps IPC_LOCK"),
    ("volumes", "volume nfs"),
    ("volumes", "volume image"),
    ("host-ipc-warn", "host-ipc"),
]


CONFIGURED_CASES = [
    (key, name)
    for key in sorted(CONFIGS)
    for name in sorted(FIXTURES) + sorted(CONFIGURED_FIXTURES)
    if name in CONFIGURED_FIXTURES or name.startswith(RELEVANT[key]) or any(p in name for p in RELEVANT[key])
]


@pytest.mark.parametrize(("key", "name"), CONFIGURED_CASES)
def test_cel_agrees_with_the_python_policy_under_each_configuration(key: str, name: str) -> None:
    fixture = {**FIXTURES, **CONFIGURED_FIXTURES}[name]
    expected = set() if name == "mirror-pod" else python_violations(fixture, CONFIGS[key])
    assert cel_denials(fixture, config=CONFIGS[key]) == expected


def test_the_configured_fixtures_are_judged_both_ways() -> None:
    allowlist = CONFIGS["allowlist"]
    outcomes = {name: python_violations(f, allowlist) for name, f in CONFIGURED_FIXTURES.items()}
    assert outcomes["ib, read-only"] == outcomes["ib trailing slash, read-only"] == set()
    assert outcomes["ib"] == outcomes["ib read-only, an init container writable"] == {"host-path"}
    assert outcomes["ib read-only, a debug container writable"] == {"host-path"}
    assert outcomes["mps"] == outcomes["mps, read-only"] == set()
    assert outcomes["data sub-path, read-only"] == {"host-path"}


@pytest.mark.parametrize(("key", "name"), CONFIGURED)
def test_the_configured_pairs_are_judged_otherwise_than_by_default(key: str, name: str) -> None:
    assert cel_denials(FIXTURES[name], config=CONFIGS[key]) != cel_denials(FIXTURES[name])


def test_the_configuration_variables_ship_the_webhook_defaults() -> None:
    """Each variable's shipped expression evaluates to what ``cel_variables_for`` writes for the defaults."""
    env = celpy.Environment()
    shipped = {v["name"]: v["expression"] for v in policy_spec()["variables"]}
    assert set(CONFIG_VARIABLES) <= set(shipped)
    for name, text in cel_variables_for(PolicyConfig()):
        assert env.program(env.compile(shipped[name])).evaluate({}) == env.program(env.compile(text)).evaluate({})


def test_every_configuration_variable_stands_for_a_config_key() -> None:
    from dataclasses import fields

    keys = {field.name for field in fields(PolicyConfig)}
    assert set(CONFIG_VARIABLES.values()) <= keys
    assert [name for name, _ in cel_variables_for(PolicyConfig())] == list(CONFIG_VARIABLES)


@pytest.mark.parametrize("name", sorted(CEL_STRICTER))
def test_cel_is_stricter_only_where_it_cannot_clean_paths(name: str) -> None:
    fixture, rule = CEL_STRICTER[name]
    assert rule in cel_denials(fixture)
    assert rule not in python_violations(fixture)


def test_every_validation_names_its_rule_id() -> None:
    _, validations, _ = compiled()
    assert [rule for rule, _ in validations] == list(RULE_IDS)


def test_protected_host_paths_mirror_the_webhook_defaults() -> None:
    from gpu_fence.webhook.config import DEFAULT_HOST_DEVICE_PATHS

    policy = one(render("overlays/vap"), "ValidatingAdmissionPolicy", "gpu-fence")["spec"]
    (expression,) = [v["expression"] for v in policy["variables"] if v["name"] == "protectedHostPaths"]
    env = celpy.Environment()
    entries = env.program(env.compile(expression)).evaluate({})
    listed = [str(e["path"]) + ("*" if str(e["mode"]) == "prefix" else "") for e in entries]
    assert listed == list(DEFAULT_HOST_DEVICE_PATHS)


# Property tests over the two places where CEL re-implements a parser with regular expressions.

VALUE_ALPHABET = st.sampled_from(["void", "none", "all", "al", "alll", "0", "GPU-1", " ", ",", "\t", "a", "l", "v"])


@settings(max_examples=150, deadline=None)
@given(st.lists(VALUE_ALPHABET, max_size=7).map("".join))
def test_visible_devices_value_parsing_agrees(value: str) -> None:
    fixture = pod(container("app", nvd(value)))
    assert ("visible-devices-env" in cel_denials(fixture)) == ("visible-devices-env" in python_violations(fixture))


QUANTITY = st.from_regex(r"\A[+-]?[0-9]{0,3}(\.[0-9]{0,2})?([eE][+-]?[0-9]|[mkMG]i?|Ki)?\Z")


@settings(max_examples=150, deadline=None)
@given(QUANTITY)
def test_gpu_quantity_recognition_agrees(amount: str) -> None:
    fixture = pod(gpu(amount=amount))
    assert ("unpinned-container" in cel_denials(fixture)) == ("unpinned-container" in python_violations(fixture))


# Plain pod UPDATEs: only CDI annotations that are new or have a new value are judged, as webhook.policy.
# validate_update judges them; the rest of an existing pod was judged at CREATE and cannot have changed.


def annotated(base: dict[str, Any], annotations: dict[str, str] | None) -> dict[str, Any]:
    updated = copy.deepcopy(base)
    if annotations is None:
        updated["metadata"].pop("annotations", None)
    else:
        updated["metadata"]["annotations"] = annotations
    return updated


NRI = "nvidia.cdi.k8s.io/pod"
#: (old annotations, new annotations) applied to a pod that would break every other rule on CREATE.
UPDATES: dict[str, tuple[dict[str, str] | None, dict[str, str] | None]] = {
    "label-like annotation added": (None, {"team": "a"}),
    "nothing changed": ({"team": "a"}, {"team": "a"}),
    "cdi annotation added": (None, {NRI: "nvidia.com/gpu=all"}),
    "cdi annotation added beside others": ({"team": "a"}, {"team": "a", "cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
    "cdi annotation value changed": ({NRI: "nvidia.com/gpu=0"}, {NRI: "nvidia.com/gpu=all"}),
    "cdi annotation kept, other added": ({NRI: "nvidia.com/gpu=0"}, {NRI: "nvidia.com/gpu=0", "team": "a"}),
    "cdi annotation removed": ({NRI: "nvidia.com/gpu=0", "team": "a"}, {"team": "a"}),
    "lookalike added": (None, {"example.com/cdi.k8s.io": "x", "cdi.k8s.io": "x"}),
    "no-boundary key added": (None, {"nvidia.cdi.k8s.io": "nvidia.com/gpu=all"}),
    "runtime device annotation added": (None, {"devices.crio.io": "/dev/nvidia0"}),
    "nri mount annotation changed": ({"mounts.nri.io/pod": "a"}, {"mounts.nri.io/pod": "b"}),
    "runtime annotation kept": ({"devices.noderesource.dev/pod": "x"}, {"devices.noderesource.dev/pod": "x", "t": "a"}),
    "mirror pod gets a cdi annotation": (
        {"kubernetes.io/config.mirror": "a"},
        {"kubernetes.io/config.mirror": "a", NRI: "nvidia.com/gpu=all"},
    ),
}
#: Unpinned, privileged, SYS_ADMIN and SYS_TIME, hostPID and hostIPC, a device-list mount, a protected and an
#: unlisted hostPath, a gitRepo volume, MIG, IMEX and gated device env, a HostProcess container, a GPU container on a
#: pod created with nodeName: everything but the annotation rules (and the two that only warn by default).
EVERYTHING_ELSE_WRONG = pod(
    container(
        "app",
        nvd("all"),
        {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
        {"name": "NVIDIA_IMEX_CHANNELS", "value": "0"},
        {"name": "NVIDIA_NVSWITCH", "value": "enabled"},
        securityContext={
            "privileged": True,
            "capabilities": {"add": ["SYS_ADMIN", "SYS_TIME"]},
            "windowsOptions": {"hostProcess": True},
        },
        volumeMounts=[
            {"name": "host", "mountPath": "/var/run/nvidia-container-devices/all"},
            {"name": "data", "mountPath": "/data"},
        ],
    ),
    container("sidecar"),
    gpu("cuda"),
    volumes=[
        {"name": "host", "hostPath": {"path": "/dev"}},
        {"name": "data", "hostPath": {"path": "/data"}},
        {"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}},
    ],
    hostPID=True,
    hostIPC=True,
    nodeName="gpu-node-1",
)
ANNOTATION_RULES = {"cdi-annotation", "runtime-annotation"}
WARN_BY_DEFAULT = {"visible-devices-none", "gpu-env-from"}


def test_the_update_base_pod_breaks_every_other_rule_on_create() -> None:
    expected = set(RULE_IDS) - ANNOTATION_RULES - WARN_BY_DEFAULT - UPDATE_RULES
    assert cel_denials(EVERYTHING_ELSE_WRONG) == expected == python_violations(EVERYTHING_ELSE_WRONG)


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cel_judges_a_pod_update_as_validate_update_does(name: str) -> None:
    old_annotations, new_annotations = UPDATES[name]
    old = annotated(EVERYTHING_ELSE_WRONG, old_annotations)
    new = annotated(EVERYTHING_ELSE_WRONG, new_annotations)
    expected = python_update_violations(new, old)
    assert cel_denials(new, old, operation="UPDATE") == expected
    # and the request form with an explicit empty subResource reads the same
    assert cel_denials(new, old, operation="UPDATE", sub_resource="") == expected


def test_update_fixtures_deny_and_allow() -> None:
    outcomes = {
        name: cel_denials(
            annotated(EVERYTHING_ELSE_WRONG, new), annotated(EVERYTHING_ELSE_WRONG, old), operation="UPDATE"
        )
        for name, (old, new) in UPDATES.items()
    }
    assert outcomes["cdi annotation added"] == {"cdi-annotation"}
    assert outcomes["cdi annotation value changed"] == {"cdi-annotation"}
    assert outcomes["cdi annotation kept, other added"] == set()
    assert outcomes["mirror pod gets a cdi annotation"] == set()
    assert outcomes["runtime device annotation added"] == {"runtime-annotation"}
    assert outcomes["nri mount annotation changed"] == {"runtime-annotation"}
    assert outcomes["runtime annotation kept"] == set()


# With gpu_node_taints, a plain UPDATE that adds a toleration bringing the pod into the node rules' scope is judged
# by them (validate_update); one that does not, or a pod already in scope, is judged on its annotations alone.

TAINTS = CONFIGS["taints"]


def tolerating(document: dict[str, Any], *tolerations: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    changed["spec"]["tolerations"] = [*changed["spec"].get("tolerations", []), *tolerations]
    return changed


def python_scoped_update_violations(pod: dict[str, Any], old: dict[str, Any]) -> set[str]:
    from gpu_fence.webhook.policy import validate_update

    return {violation.rule for violation in validate_update(pod, old, TAINTS).violations}


OUT_OF_SCOPE = taint_pod()
#: The node rules of volume types and host namespaces: a gitRepo volume, the node's IPC namespace, a Windows
#: HostProcess container, on a pod that tolerates no GPU taint.
NODE_REACHING = pod(
    container("app", VOID, securityContext={"windowsOptions": {"hostProcess": True}}),
    volumes=[{"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}}],
    hostIPC=True,
)
#: A KAI fraction pod as created, under a KAI scheduler the taint configuration takes as taint-aware, in the node's
#: IPC namespace, without the runtime class KAI's runtime enforcement sets (which alone would bring it into scope):
#: out of the node rules' scope, but KAI's binder reads its annotations all the same.
KAI_OUT_OF_SCOPE = kai_left(container("main"), container("sidecar", VOID), hostIPC=True)
del KAI_OUT_OF_SCOPE["spec"]["runtimeClassName"]


def kai_retargeted(document: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    changed["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "main-bcdfghj-shared-gpu"
    return changed


TOLERATION_UPDATES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gpu toleration added": (OUT_OF_SCOPE, tolerating(OUT_OF_SCOPE, GPU_TAINT_TOLERATION)),
    "tolerate-everything added": (OUT_OF_SCOPE, tolerating(OUT_OF_SCOPE, {"operator": "Exists"})),
    "unrelated toleration added": (OUT_OF_SCOPE, tolerating(OUT_OF_SCOPE, {"key": "dedicated", "operator": "Exists"})),
    "second gpu toleration": (
        tolerating(OUT_OF_SCOPE, GPU_TAINT_TOLERATION),
        tolerating(OUT_OF_SCOPE, GPU_TAINT_TOLERATION, {"operator": "Exists"}),
    ),
    "runtime annotation added out of scope": (
        OUT_OF_SCOPE,
        annotated(OUT_OF_SCOPE, {"devices.crio.io": "/dev/nvidia0", "mounts.nri.io/pod": "x"}),
    ),
    "cdi annotation added out of scope": (
        OUT_OF_SCOPE,
        annotated(OUT_OF_SCOPE, {"devices.crio.io": "/dev/nvidia0", NRI: "nvidia.com/gpu=all"}),
    ),
    "gpu toleration added to a node-reaching pod": (NODE_REACHING, tolerating(NODE_REACHING, GPU_TAINT_TOLERATION)),
    "kai prefix changed out of scope": (KAI_OUT_OF_SCOPE, kai_retargeted(KAI_OUT_OF_SCOPE)),
    "kai prefix changed and a gpu toleration added": (
        KAI_OUT_OF_SCOPE,
        tolerating(kai_retargeted(KAI_OUT_OF_SCOPE), GPU_TAINT_TOLERATION),
    ),
}


@pytest.mark.parametrize("name", sorted(TOLERATION_UPDATES))
def test_cel_judges_a_toleration_update_as_validate_update_does(name: str) -> None:
    old, new = TOLERATION_UPDATES[name]
    assert cel_denials(new, old, operation="UPDATE", config=TAINTS) == python_scoped_update_violations(new, old)


def test_toleration_updates_deny_and_allow() -> None:
    node_rules = {"privileged", "sys-admin-capability", "added-capability", "host-pid", "runtime-annotation"}
    node_rules |= {"host-device-path", "host-path"}
    outcomes = {name: python_scoped_update_violations(new, old) for name, (old, new) in TOLERATION_UPDATES.items()}
    assert outcomes["gpu toleration added"] == outcomes["tolerate-everything added"] == node_rules
    assert outcomes["unrelated toleration added"] == outcomes["second gpu toleration"] == set()
    assert outcomes["runtime annotation added out of scope"] == set()
    assert outcomes["cdi annotation added out of scope"] == {"cdi-annotation"}  # a GPU path: judged on every pod
    assert outcomes["gpu toleration added to a node-reaching pod"] == {"volume-type", "host-process", "host-ipc"}
    assert outcomes["kai prefix changed out of scope"] == {"kai-annotation-update"}  # the allocation: every pod
    assert outcomes["kai prefix changed and a gpu toleration added"] == {"kai-annotation-update", "host-ipc"}
    # without a taint configured, an added toleration changes nothing
    old, new = TOLERATION_UPDATES["gpu toleration added"]
    assert cel_denials(new, old, operation="UPDATE") == set()


# kubectl debug: an UPDATE of pods/ephemeralcontainers is judged on the ephemeral containers it adds (and the
# hostPath volumes they mount), as the webhook judges it (webhook.review.new_container_names + validate(only=)).


def python_debug_violations(pod: dict[str, Any], old: dict[str, Any]) -> set[str]:
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy import exemption, validate

    config = load_config(None)
    if exemption(pod, config, namespace="team-a"):
        return set()
    before = {c["name"] for c in old["spec"].get("ephemeralContainers", [])}
    new = {c["name"] for c in pod["spec"].get("ephemeralContainers", [])} - before
    if not new:
        return set()
    return {violation.rule for violation in validate(pod, config, only=new).violations}


def debugged(base: dict[str, Any], *ephemeral: dict[str, Any], volumes: list[dict[str, Any]] = ()) -> dict[str, Any]:
    pod_copy = copy.deepcopy(base)
    pod_copy["spec"].setdefault("ephemeralContainers", []).extend(copy.deepcopy(list(ephemeral)))
    pod_copy["spec"].setdefault("volumes", []).extend(copy.deepcopy(list(volumes)))
    return pod_copy


TWO_CONTAINERS = pod(gpu("trainer"), container("web", VOID))
SHARED_TWO = pod(gpu("trainer"), container("web", VOID), shareProcessNamespace=True)
HOST_NETWORK_POD = pod(gpu("trainer"), hostNetwork=True)
BROKEN_POD = annotated(EVERYTHING_ELSE_WRONG, {NRI: "nvidia.com/gpu=all", "devices.crio.io": "/dev/nvidia0"})
OLD_DEBUG = container("old-debug", nvd("all"), securityContext={"privileged": True})
HOST_DEV = {"name": "host-dev", "hostPath": {"path": "/dev/nvidia0"}}
DEBUG_UPDATES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "clean pinned debugger on a broken pod": (BROKEN_POD, debugged(BROKEN_POD, container("debug", VOID))),
    "unpinned debugger": (BROKEN_POD, debugged(BROKEN_POD, container("debug"))),
    "debugger asks for all GPUs": (BROKEN_POD, debugged(BROKEN_POD, container("debug", nvd("all")))),
    "privileged debugger": (
        BROKEN_POD,
        debugged(BROKEN_POD, container("debug", VOID, securityContext={"privileged": True})),
    ),
    "SYS_ADMIN debugger": (
        BROKEN_POD,
        debugged(BROKEN_POD, container("debug", VOID, securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})),
    ),
    "debugger mounts the device list": (
        BROKEN_POD,
        debugged(
            BROKEN_POD,
            container("debug", VOID, volumeMounts=[{"name": "host", "mountPath": "/run/nvidia-container-devices/all"}]),
        ),
    ),
    "debugger sets MIG env": (
        BROKEN_POD,
        debugged(BROKEN_POD, container("debug", VOID, {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})),
    ),
    "debugger mounts the pod's /dev hostPath": (
        BROKEN_POD,
        debugged(BROKEN_POD, container("debug", VOID, volumeMounts=[{"name": "host", "mountPath": "/host"}])),
    ),
    "clean debugger beside an old bad one": (
        debugged(BROKEN_POD, OLD_DEBUG),
        debugged(BROKEN_POD, OLD_DEBUG, container("debug", VOID)),
    ),
    "no new debugger": (debugged(BROKEN_POD, OLD_DEBUG), debugged(BROKEN_POD, OLD_DEBUG)),
    "clean pod, debugger mounts a device hostPath": (
        debugged(pod(container("app", VOID)), volumes=[HOST_DEV]),
        debugged(
            pod(container("app", VOID)),
            container("debug", VOID, volumeMounts=[{"name": "host-dev", "mountPath": "/gpu"}]),
            volumes=[HOST_DEV],
        ),
    ),
    "ptrace debugger targets the GPU container": (
        TWO_CONTAINERS,
        debugged(TWO_CONTAINERS, ptrace("debug", targetContainerName="trainer")),
    ),
    "ptrace debugger targets the CPU container": (
        TWO_CONTAINERS,
        debugged(TWO_CONTAINERS, ptrace("debug", targetContainerName="web")),
    ),
    "ptrace debugger without a target": (TWO_CONTAINERS, debugged(TWO_CONTAINERS, ptrace("debug"))),
    "ptrace debugger in a shared pod": (SHARED_TWO, debugged(SHARED_TWO, ptrace("debug"))),
    "net-admin debugger in a host-network pod": (
        HOST_NETWORK_POD,
        debugged(HOST_NETWORK_POD, net("NET_ADMIN", "debug")),
    ),
    "clean pod, device hostPath not mounted by the debugger": (
        debugged(pod(container("app", VOID)), volumes=[HOST_DEV]),
        debugged(pod(container("app", VOID)), container("debug", VOID), volumes=[HOST_DEV]),
    ),
}


@pytest.mark.parametrize("name", sorted(DEBUG_UPDATES))
def test_cel_judges_kubectl_debug_as_the_webhook_does(name: str) -> None:
    old, new = DEBUG_UPDATES[name]
    expected = python_debug_violations(new, old)
    assert cel_denials(new, old, operation="UPDATE", sub_resource="ephemeralcontainers") == expected


def test_debug_fixtures_deny_and_allow() -> None:
    outcomes = {
        name: cel_denials(new, old, operation="UPDATE", sub_resource="ephemeralcontainers")
        for name, (old, new) in DEBUG_UPDATES.items()
    }
    assert outcomes["clean pinned debugger on a broken pod"] == set()
    assert outcomes["clean debugger beside an old bad one"] == set()
    assert outcomes["debugger asks for all GPUs"] == {"visible-devices-env"}
    assert outcomes["privileged debugger"] == {"privileged"}
    assert outcomes["debugger mounts the pod's /dev hostPath"] == {"host-device-path"}
    assert outcomes["clean pod, debugger mounts a device hostPath"] == {"host-device-path"}
    assert outcomes["clean pod, device hostPath not mounted by the debugger"] == set()
    assert outcomes["ptrace debugger targets the GPU container"] == {"added-capability"}
    assert outcomes["ptrace debugger in a shared pod"] == {"added-capability"}
    assert outcomes["net-admin debugger in a host-network pod"] == {"added-capability"}
    assert (
        outcomes["ptrace debugger targets the CPU container"] == outcomes["ptrace debugger without a target"] == set()
    )
    # the same pods as a CREATE are judged whole
    broken = DEBUG_UPDATES["clean pinned debugger on a broken pod"][1]
    assert cel_denials(broken) == set(RULE_IDS) - WARN_BY_DEFAULT - UPDATE_RULES


UPDATE_ANNOTATIONS = st.none() | st.dictionaries(
    st.sampled_from(
        [
            "cdi.k8s.io/gpu",
            "cdi.k8s.io/x",
            "nvidia.cdi.k8s.io",
            NRI,
            "nvidia.cdi.k8s.io.other",
            "team",
            "example.com/cdi.k8s.io",
            "cdi.k8s.io",
            "devices.crio.io",
            "mounts.noderesource.dev/pod",
            "devices.crio",
        ]
    ),
    st.sampled_from(["", "nvidia.com/gpu=0", "nvidia.com/gpu=all"]),
    max_size=4,
)


@settings(max_examples=80, deadline=None)
@given(old=UPDATE_ANNOTATIONS, new=UPDATE_ANNOTATIONS)
def test_pod_update_judgement_agrees_on_any_annotation_change(old, new) -> None:
    before, after = annotated(EVERYTHING_ELSE_WRONG, old), annotated(EVERYTHING_ELSE_WRONG, new)
    assert cel_denials(after, before, operation="UPDATE") == python_update_violations(after, before)


# KAI's bind-time annotations: on a pod under the KAI scheduler, a plain UPDATE that adds, removes or changes one is
# judged (kai-annotation-update), as webhook.policy.validate_update judges it; KAI's own updates (its binder's and
# pod grouper's annotations) and every update of another scheduler's pod are not.

KAI_POD = kai_left(container("main"), container("sidecar", VOID))
KAI_AS_CREATED = dict(KAI_POD["metadata"]["annotations"])
OTHER_PREFIX = "main-bcdfghj-shared-gpu"
KAI_UPDATES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "binder's bind annotations": (
        KAI_AS_CREATED,
        {**KAI_AS_CREATED, "received-resource-type": "Fraction", "kai.scheduler/numa-placement-predicted": "[0]"},
    ),
    "pod grouper's annotation": (KAI_AS_CREATED, {**KAI_AS_CREATED, "pod-group-name": "pg-demo"}),
    "unrelated annotation": (KAI_AS_CREATED, {**KAI_AS_CREATED, "team": "a"}),
    "nothing changed": (KAI_AS_CREATED, KAI_AS_CREATED),
    "prefix changed": (KAI_AS_CREATED, {**KAI_AS_CREATED, "runai/shared-gpu-configmap": OTHER_PREFIX}),
    "prefix removed": (KAI_AS_CREATED, {k: v for k, v in KAI_AS_CREATED.items() if k != "runai/shared-gpu-configmap"}),
    "fraction removed": (KAI_AS_CREATED, {k: v for k, v in KAI_AS_CREATED.items() if k != "gpu-fraction"}),
    "fraction changed": (KAI_AS_CREATED, {**KAI_AS_CREATED, "gpu-fraction": "0.25"}),
    "memory added": (KAI_AS_CREATED, {**KAI_AS_CREATED, "gpu-memory": "2000"}),
    "fraction container named": (KAI_AS_CREATED, {**KAI_AS_CREATED, "gpu-fraction-container-name": "sidecar"}),
    "all annotations dropped": (KAI_AS_CREATED, {}),
}


def kai_update(old: dict[str, str], new: dict[str, str], scheduler: str = "kai-scheduler") -> tuple[dict, dict]:
    before, after = annotated(KAI_POD, old), annotated(KAI_POD, new)
    before["spec"]["schedulerName"] = after["spec"]["schedulerName"] = scheduler
    return before, after


@pytest.mark.parametrize("name", sorted(KAI_UPDATES))
@pytest.mark.parametrize("scheduler", ["kai-scheduler", "default-scheduler"])
def test_cel_judges_a_kai_annotation_update_as_validate_update_does(name: str, scheduler: str) -> None:
    before, after = kai_update(*KAI_UPDATES[name], scheduler=scheduler)
    assert cel_denials(after, before, operation="UPDATE") == python_update_violations(after, before)


def test_kai_update_fixtures_deny_and_allow() -> None:
    outcomes = {
        name: cel_denials(after, before, operation="UPDATE")
        for name, (before, after) in ((name, kai_update(*change)) for name, change in KAI_UPDATES.items())
    }
    allowed = {"binder's bind annotations", "pod grouper's annotation", "unrelated annotation", "nothing changed"}
    for name, denied in outcomes.items():
        assert denied == (set() if name in allowed else {"kai-annotation-update"}), name
    for name, change in KAI_UPDATES.items():  # another scheduler's pod: the annotations mean nothing to KAI
        before, after = kai_update(*change, scheduler="default-scheduler")
        assert cel_denials(after, before, operation="UPDATE") == set(), name


KAI_ANNOTATION_MAPS = st.dictionaries(
    st.sampled_from(
        ["gpu-fraction", "gpu-memory", "gpu-fraction-container-name", "runai/shared-gpu-configmap", "pod-group-name"]
    ),
    st.sampled_from(["0.5", "main", KAI_PREFIX, OTHER_PREFIX]),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(old=KAI_ANNOTATION_MAPS, new=KAI_ANNOTATION_MAPS, scheduler=st.sampled_from(["kai-scheduler", "other"]))
def test_kai_update_judgement_agrees_on_any_annotation_change(old, new, scheduler) -> None:
    before, after = kai_update(old, new, scheduler=scheduler)
    assert cel_denials(after, before, operation="UPDATE") == python_update_violations(after, before)


def test_the_policy_matches_what_the_validating_webhooks_match() -> None:
    objects = render("overlays/vap")
    policy = one(objects, "ValidatingAdmissionPolicy", "gpu-fence")["spec"]
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/ephemeralcontainers"]},
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]},
    ]
    # one condition text, in the policy and in both validating webhook entries: they must not drift apart
    hooks = one(objects, "ValidatingWebhookConfiguration", "gpu-fence-validating")["webhooks"]
    for hook in hooks:
        assert hook["matchConditions"] == policy["matchConditions"], hook["name"]


# docs/cel-policy.md tells sites how to patch a configuration variable: its example renders, and the policy it
# renders admits what the matching policy.yaml admits.

CEL_DOC = Path(__file__).resolve().parents[2] / "docs" / "cel-policy.md"


def test_the_documented_variable_indexes_are_the_policy_s() -> None:
    text = " ".join(CEL_DOC.read_text(encoding="utf-8").split())
    names = [v["name"] for v in policy_spec()["variables"]]
    listed = re.search(r"The variables are, by index: (.*?) \(a test", text)
    assert listed, "docs/cel-policy.md lists the configuration variables by index"
    pairs = re.findall(r"(\d+) `(\w+)`", listed.group(1))
    assert [name for _, name in pairs] == list(CONFIG_VARIABLES)
    assert all(names[int(index)] == name for index, name in pairs)


def test_the_documented_patch_renders_and_admits_the_rdma_devices(tmp_path: Path) -> None:
    text = CEL_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Keeping it in step") :]
    kustomization = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    overlay = Path(__file__).resolve().parents[2] / "manifests" / "overlays" / "vap"
    kustomization["resources"] = [os.path.relpath(overlay, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    result = run_captured(
        [kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)], timeout=120
    )
    assert result.returncode == 0, result.stderr
    [policy] = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ValidatingAdmissionPolicy"]
    [expression] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "hostPathAllowlist"]
    rdma = PolicyConfig(host_path_allowlist=(HostPathEntry("/dev/infiniband"),))
    env = celpy.Environment()
    wanted = dict(cel_variables_for(rdma))["hostPathAllowlist"]
    assert env.program(env.compile(expression)).evaluate({}) == env.program(env.compile(wanted)).evaluate({})
    ib = read_only(host_path_pod("/dev/infiniband"))
    assert python_violations(ib, rdma) == cel_denials(ib, config=rdma) == set()
    assert "host-path" in cel_denials(ib)


# The manifests of common stacks (tests/webhook/data/stacks/), pinned as the mutating webhook leaves them (a policy
# cannot mutate): the ordinary workloads pass the policy, what reaches the node is denied by the same rules as the
# webhook denies it with.

STACK_PODS = stack_pods()


@pytest.mark.parametrize("stack", STACK_PODS, ids=lambda stack: stack.id)
def test_cel_admits_the_stacks_workloads_and_denies_what_reaches_the_node(stack: StackPod) -> None:
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy import apply_patch, mutate

    pinned = apply_patch(stack.pod, mutate(stack.pod, load_config(None)).patch)
    denied = cel_denials(pinned)
    assert denied == set(stack.expected.rules) == python_violations(pinned)


# Where nothing pins (a warn namespace: no mutating webhook runs there), a container without the pin is no
# violation of its own: the webhook says once what enforcing would pin, and the policy's Warn binding must not
# warn once per container instead. Where the webhook pins (enforce, by label or by default), it is one.

UNPINNED = pod(gpu("cuda"), container("sidecar"), container("logger"))
ENFORCE_BY_DEFAULT = (("enforceByDefault", "true"),)


@pytest.mark.parametrize(
    ("mode", "overrides", "judged"),
    [
        ("enforce", (), True),
        ("warn", (), False),
        (None, (), False),  # the shipped default: warn
        ("typo", (), False),
        (None, ENFORCE_BY_DEFAULT, True),  # components/enforce
        ("typo", ENFORCE_BY_DEFAULT, True),
        ("warn", ENFORCE_BY_DEFAULT, False),
    ],
)
def test_unpinned_containers_are_judged_only_where_the_webhook_pins(mode, overrides, judged) -> None:
    denied = cel_denials(UNPINNED, mode=mode, overrides=overrides)
    assert denied == ({"unpinned-container"} if judged else set())
    broken = pod(gpu("cuda"), container("sidecar", nvd("all")))  # every other rule is judged in every mode
    assert cel_denials(broken, mode=mode, overrides=overrides) == {"visible-devices-env"}


def test_the_enforce_component_sets_enforce_by_default_in_the_policy(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    relative = os.path.relpath(Path(__file__).resolve().parents[2] / "manifests", site)
    (site / "kustomization.yaml").write_text(
        f"resources:\n  - {relative}/overlays/vap\ncomponents:\n  - {relative}/components/enforce\n"
    )
    result = run_captured([kubectl(), "kustomize", str(site)], timeout=120)
    assert result.returncode == 0, result.stderr
    [policy] = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ValidatingAdmissionPolicy"]
    variables = {v["name"]: v["expression"].strip() for v in policy["spec"]["variables"]}
    assert variables["enforceByDefault"] == "true"
    shipped = {v["name"]: v["expression"].strip() for v in policy_spec()["variables"]}
    assert shipped["enforceByDefault"] == "false"
