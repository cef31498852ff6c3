"""Pod builders and hypothesis strategies shared by the webhook tests (``from pods import ...``).

Builders return plain dicts shaped exactly like a JSON-decoded Pod, valid against the Kubernetes schema unless a
test asks for something the schema forbids. Strategies generate schema-valid pods (``pods()``) and arbitrary
JSON-like garbage grafted into pods (``mangled_pods()``) for the "never raises" properties.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import yaml
from hypothesis import strategies as st

from gpu_fence import kai
from gpu_fence.vocabulary import CONTAINER_FIELDS, VISIBLE_DEVICES_ENV

NVD = VISIBLE_DEVICES_ENV
DATA = Path(__file__).parents[1] / "webhook" / "data"
KUBERNETES_VERSION = "1.37"  # newest schema shipped by the installed kubernetes-validate

# ---------------------------------------------------------------------------------------------------------------
# Builders


def env(name: str, value: str | None = None, **value_from: Any) -> dict[str, Any]:
    """One env entry: ``env("X", "1")`` or ``env("X", configMapKeyRef={"name": "cm", "key": "k"})``."""
    entry: dict[str, Any] = {"name": name}
    if value is not None:
        entry["value"] = value
    if value_from:
        entry["valueFrom"] = value_from
    return entry


def container(
    name: str = "app",
    *,
    image: str = "busybox:1.36",
    gpus: int | str | None = None,
    resource: str = "nvidia.com/gpu",
    environment: Iterable[Mapping[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A container; ``gpus`` sets ``resources.limits[resource]``; ``environment`` becomes ``env``."""
    body: dict[str, Any] = {"name": name, "image": image}
    if gpus is not None:
        body["resources"] = {"limits": {resource: gpus}}
    if environment is not None:
        body["env"] = [dict(entry) for entry in environment]
    body.update(fields)
    return body


def gpu_container(name: str = "cuda", gpus: int | str = 1, **fields: Any) -> dict[str, Any]:
    return container(name, image="nvidia/cuda:12.4.1-base-ubuntu22.04", gpus=gpus, **fields)


def pod(
    *containers: dict[str, Any],
    name: str = "demo",
    namespace: str | None = None,
    annotations: Mapping[str, str] | None = None,
    init: Iterable[dict[str, Any]] = (),
    ephemeral: Iterable[dict[str, Any]] = (),
    **spec: Any,
) -> dict[str, Any]:
    """A Pod with these containers (a default non-GPU one when none are given) and extra spec fields."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": list(containers) or [container()]}
    init, ephemeral = list(init), list(ephemeral)
    if init:
        body["initContainers"] = init
    if ephemeral:
        body["ephemeralContainers"] = ephemeral
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def host_path_pod(path: str, *, mount_at: str = "/host") -> dict[str, Any]:
    """A pod whose one container mounts ``path`` from the host."""
    return pod(
        container(volumeMounts=[{"name": "host", "mountPath": mount_at}]),
        volumes=[{"name": "host", "hostPath": {"path": path}}],
    )


def kai_fraction_pod(
    *containers: dict[str, Any], fraction_container: str | None = None, scheduler: str = "kai-scheduler"
) -> dict[str, Any]:
    annotations = {"gpu-fraction": "0.5"}
    if fraction_container is not None:
        annotations["gpu-fraction-container-name"] = fraction_container
    return pod(*containers, annotations=annotations, schedulerName=scheduler)


#: A ConfigMap name prefix in the shape KAI generates (``<name>-<7 of rand.String's alphabet>-shared-gpu``).
KAI_PREFIX = "trainer-7b2kx9q-shared-gpu"


def kai_reference(prefix: str = KAI_PREFIX, *, index: int = 0, init: bool = False, **changes: Any) -> dict[str, Any]:
    """The ``NVIDIA_VISIBLE_DEVICES`` entry KAI's webhook gives the fraction container (``changes`` alter the
    ``configMapKeyRef``; a value of None removes that field)."""
    reference: dict[str, Any] = {
        "name": kai.capabilities_config_map(prefix, init=init, index=index),
        "key": NVD,
    }
    for key, value in changes.items():
        if value is None:
            reference.pop(key, None)
        else:
            reference[key] = value
    return {"name": NVD, "valueFrom": {"configMapKeyRef": reference}}


def as_kai_leaves_it(document: Mapping[str, Any], *, prefix: str = KAI_PREFIX) -> dict[str, Any]:
    """What KAI's mutating webhook makes of a fraction pod, step by step as its ``gpusharing`` and
    ``runtimeenforcement`` plugins do (kai-scheduler/KAI-Scheduler d5bc503a: ``gpusharing/gpu_sharing.go`` Mutate,
    ``binder/common/gpu_access.go`` AddGPUSharingEnvVars and GetFractionContainerRef, ``env_vars.go``,
    ``volumes.go``, ``runtime_enforcement.go``): the prefix annotation (kept if present), the three env entries
    (each replacing any entry of its name), the ``-evar`` envFrom, the ConfigMap volume, runtime class nvidia."""
    pod_copy = copy.deepcopy(dict(document))
    metadata, spec = pod_copy["metadata"], pod_copy["spec"]
    annotations = metadata.setdefault("annotations", {})
    named = annotations.get(kai.FRACTION_CONTAINER_ANNOTATION)
    init, index = False, 0
    if named is not None:
        found = [(True, i) for i, c in enumerate(spec.get("initContainers", [])) if c["name"] == named]
        found += [(False, i) for i, c in enumerate(spec["containers"]) if c["name"] == named]
        init, index = found[0]
    body = (spec["initContainers"] if init else spec["containers"])[index]
    prefix = annotations.setdefault(kai.SHARED_GPU_CONFIG_MAP_ANNOTATION, prefix)
    config_map = kai.capabilities_config_map(prefix, init=init, index=index)
    for name in (NVD, "RUNAI_NUM_OF_GPUS", "GPU_PORTION"):
        entry = {"name": name, "valueFrom": {"configMapKeyRef": {"name": config_map, "key": name}}}
        body["env"] = [e for e in body.get("env") or [] if e["name"] != name] + [entry]
    evar = kai.direct_env_config_map(prefix, init=init, index=index)
    sources = body.setdefault("envFrom", [])
    if not any(s.get("configMapRef", {}).get("name") == evar for s in sources):
        sources.append({"configMapRef": {"name": evar, "optional": False}})
    volume = re.sub(r"[^a-z0-9-]+", "-", (config_map + "-vol").lower()).strip("-")
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != volume]
    spec["volumes"].append({"name": volume, "configMap": {"name": config_map}})
    spec.setdefault("runtimeClassName", "nvidia")
    return pod_copy


def all_containers(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = manifest.get("spec", {})
    return [c for field in CONTAINER_FIELDS for c in spec.get(field) or []]


def env_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """A container's env as the kubelet resolves duplicates: the last entry of a name wins."""
    return {entry["name"]: entry.get("value") for entry in body.get("env") or []}


def pod_specs(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods a manifest stands for: a Pod itself, or a workload's ``spec.template`` wrapped as a Pod."""
    if document.get("kind") == "Pod":
        return [copy.deepcopy(dict(document))]
    template = (document.get("spec") or {}).get("template")
    if document.get("kind") == "CronJob":
        template = document["spec"]["jobTemplate"]["spec"]["template"]
    if not isinstance(template, Mapping):
        return []
    metadata = {"name": document["metadata"]["name"], **copy.deepcopy(template.get("metadata") or {})}
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}]


def manifest_pods(filename: str) -> list[dict[str, Any]]:
    """Every pod of a saved real-world manifest under ``tests/webhook/data/``."""
    with (DATA / filename).open(encoding="utf-8") as stream:
        return [p for document in yaml.safe_load_all(stream) if document for p in pod_specs(document)]


def apply_patch(document: Mapping[str, Any], patch: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply RFC 6902 operations with the reference ``jsonpatch`` implementation (never in place)."""
    return jsonpatch.JsonPatch([dict(op) for op in patch]).apply(copy.deepcopy(dict(document)), in_place=False)


def assert_valid_pod(document: Mapping[str, Any]) -> None:
    """Fail unless the object is a Pod the Kubernetes API schema accepts (strict: no unknown fields)."""
    kubernetes_validate.validate(dict(document), KUBERNETES_VERSION, strict=True)


# ---------------------------------------------------------------------------------------------------------------
# Strategies

#: Every NVIDIA_VISIBLE_DEVICES value the toolkit research lists as an edge case (research §6), plus a few more.
VISIBLE_DEVICES_EDGE_VALUES = (
    "all",
    " all ",
    "ALL",
    "void",
    "VOID",
    "none",
    "",
    ",",
    "0,void",
    "void,0",
    "0,all",
    "none,all",
    "all,none",
    "GPU-8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01",
    "MIG-3b1e2f4a-5c6d-4e7f-8a9b-0c1d2e3f4a5b",
    "MIG-GPU-8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01/1/0",
    "0:1",
    "nvidia.com/gpu=all",
    "/var/run/nvidia-container-devices",
    "0",
    "0,1",
    " void ",
    "void,all",
    "$(GPUS)",
    "$$(GPUS)",
)

names = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
env_names = st.sampled_from(
    [NVD, "NVIDIA_DRIVER_CAPABILITIES", "CUDA_VISIBLE_DEVICES", "PATH", "HOME", "NVIDIA_MIG_MONITOR_DEVICES"]
)
env_values = st.sampled_from(VISIBLE_DEVICES_EDGE_VALUES) | st.text(max_size=12)
gpu_quantities = st.sampled_from([0, 1, 2, "0", "1", "2", "500m", "0.5"])
gpu_resources = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "cpu"]
)


@st.composite
def env_entries(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(env_names)
    if draw(st.integers(0, 5)) == 0:
        source = draw(
            st.sampled_from(
                [
                    {"configMapKeyRef": {"name": "gpus", "key": "visible"}},
                    {"secretKeyRef": {"name": "gpus", "key": "visible"}},
                    {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
                ]
            )
        )
        return {"name": name, "valueFrom": source}
    return {"name": name, "value": draw(env_values)}


@st.composite
def containers(draw: st.DrawFn, name: str, *, ephemeral: bool = False, sidecar: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": draw(st.sampled_from(["busybox", "nvidia/cuda:12.4.1-base"]))}
    if not ephemeral and draw(st.booleans()):
        limits = {draw(gpu_resources): draw(gpu_quantities)}
        section = draw(st.sampled_from(["limits", "requests"]))
        body["resources"] = {section: limits}
    choice = draw(st.integers(0, 3))
    if choice == 1:
        body["env"] = []
    elif choice >= 2:
        body["env"] = draw(st.lists(env_entries(), max_size=4))
    if draw(st.integers(0, 4)) == 0:
        body["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    if draw(st.integers(0, 5)) == 0:
        body["securityContext"] = {
            "privileged": draw(st.booleans()),
            "capabilities": {
                "add": draw(
                    st.lists(st.sampled_from(["NET_ADMIN", "SYS_ADMIN", "ALL", "sys_admin", "CHOWN"]), max_size=2)
                )
            },
        }
    if draw(st.integers(0, 4)) == 0:
        mount = draw(
            st.sampled_from(
                [
                    "/data",
                    "/var/run/nvidia-container-devices/all",
                    "/run/../dev",
                    "/var/run/nvidia-container-devicesall",
                    "/host",
                ]
            )
        )
        body["volumeMounts"] = [{"name": "vol", "mountPath": mount}]
    if sidecar:
        body["restartPolicy"] = "Always"
    return body


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """Schema-valid Pods mixing GPU and non-GPU containers, init (sidecar) and ephemeral containers, attacks."""
    all_names = draw(st.lists(names, min_size=1, max_size=7, unique=True))
    main_count = draw(st.integers(1, len(all_names)))
    init_count = draw(st.integers(0, len(all_names) - main_count))
    main_names = all_names[:main_count]
    init_names = all_names[main_count : main_count + init_count]
    ephemeral_names = all_names[main_count + init_count :]
    spec: dict[str, Any] = {"containers": [draw(containers(n)) for n in main_names]}
    if init_names:
        spec["initContainers"] = [draw(containers(n, sidecar=draw(st.booleans()))) for n in init_names]
    if ephemeral_names:
        spec["ephemeralContainers"] = [draw(containers(n, ephemeral=True)) for n in ephemeral_names]
    spec["volumes"] = [
        {"name": "vol", "hostPath": {"path": draw(st.sampled_from(["/data", "/dev", "/", "/dev/shm"]))}}
        if draw(st.booleans())
        else {"name": "vol", "emptyDir": {}}
    ]
    if draw(st.booleans()):
        spec["runtimeClassName"] = draw(st.sampled_from(["nvidia", "runc", "nvidia-cdi"]))
    metadata: dict[str, Any] = {"name": draw(names)}
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                ["gpu-fraction", "team", "cdi.k8s.io/x", "nvidia.cdi.k8s.io/pod", "gpu-fraction-container-name"]
            ),
            st.sampled_from(["0.5", main_names[0], "nvidia.com/gpu=all"]),
            max_size=2,
        )
    )
    if annotations:
        metadata["annotations"] = annotations
        spec["schedulerName"] = draw(st.sampled_from(["kai-scheduler", "default-scheduler"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
#: Anything a JSON or YAML decoder can produce, including the wrong type in every position.
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

_GRAFT_POINTS = (
    ("spec",),
    ("metadata",),
    ("metadata", "annotations"),
    ("spec", "containers"),
    ("spec", "containers", 0),
    ("spec", "containers", 0, "env"),
    ("spec", "containers", 0, "env", 0),
    ("spec", "containers", 0, "env", 0, "name"),
    ("spec", "containers", 0, "env", 0, "value"),
    ("spec", "containers", 0, "env", 0, "valueFrom"),
    ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "name"),
    ("spec", "containers", 0, "securityContext"),
    ("spec", "containers", 0, "volumeMounts"),
    ("spec", "volumes"),
    ("spec", "schedulerName"),
    ("spec", "runtimeClassName"),
    ("spec", "initContainers"),
    ("spec", "ephemeralContainers"),
    ("spec", "serviceAccountName"),
    ("metadata", "annotations", "gpu-fraction-container-name"),
)


@st.composite
def mangled_pods(draw: st.DrawFn) -> Any:
    """A generated pod with garbage grafted at a few places, or garbage instead of a pod."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    document = draw(pods())
    for path in draw(st.lists(st.sampled_from(_GRAFT_POINTS), min_size=1, max_size=3)):
        node: Any = document
        for step in path[:-1]:
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if isinstance(node, dict) or (isinstance(node, list) and isinstance(path[-1], int) and node):
            node[path[-1] if isinstance(node, dict) else 0] = draw(json_values)
    return document
