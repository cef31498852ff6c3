"""AdmissionReview bodies for the benchmarks: a typical application pod with 1, 10 or 50 containers.

"Typical" means what a real Deployment's pod carries: labels and annotations, projected/configMap/secret/emptyDir
volumes, a service account token mount, a dozen env entries (some from the downward API), requests and limits,
ports and probes. In a multi-container pod the first container requests one ``nvidia.com/gpu`` and the others
are non-GPU sidecars; the 1-container pod is a non-GPU application, the commonest pod in a cluster. No non-GPU
container sets ``NVIDIA_VISIBLE_DEVICES``, so ``/mutate`` pins every one of them (the most work mutation can have)
and ``/validate`` judges the pinned pod, as the API server sends it after mutation.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import orjson

CONTAINER_COUNTS = (1, 10, 50)
NAMESPACE = "team-ml"
NAMESPACE_FIELD = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}


def container(number: int, *, gpu: bool) -> dict[str, Any]:
    name = "trainer" if number == 0 else f"sidecar-{number}"
    limits: dict[str, Any] = {"cpu": "2", "memory": "4Gi"}
    if gpu:
        limits["nvidia.com/gpu"] = "1"
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        {"name": "LOG_LEVEL", "value": "info"},
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4317"},
        {"name": "OTEL_SERVICE_NAME", "value": name},
        {"name": "HTTP_PORT", "value": str(8080 + number)},
        {"name": "CACHE_DIR", "value": "/cache"},
        {"name": "FEATURE_FLAGS", "value": "batching,compression"},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api-token", "key": "token"}}},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        {"name": "TZ", "value": "UTC"},
    ]
    return {
        "name": name,
        "image": f"registry.example.com/ml/{name}:1.4.2",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--config", "/etc/app/config.yaml", "--port", str(8080 + number)],
        "ports": [{"name": "http", "containerPort": 8080 + number, "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": limits},
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {"name": "cache", "mountPath": "/cache"},
            {
                "name": "kube-api-access-x7k2p",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080 + number}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/live", "port": 8080 + number}, "periodSeconds": 20},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def typical_pod(containers: int) -> dict[str, Any]:
    """The pod as the API server sends it to ``/mutate`` on CREATE (defaults applied, not yet pinned)."""
    if containers < 1:
        raise ValueError("a pod has at least one container")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7d9f8b6c5-",
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "trainer",
                "app.kubernetes.io/part-of": "ml-platform",
                "pod-template-hash": "7d9f8b6c5",
                "team": "ml",
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                "checksum/config": "5d41402abc4b2a76b9719d911017c592",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8b6c5",
                    "uid": "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "serviceAccountName": "trainer",
            "schedulerName": "default-scheduler",
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "containers": [container(number, gpu=number == 0 and containers > 1) for number in range(containers)],
            "volumes": [
                {"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
                {"name": "credentials", "secret": {"secretName": "trainer-credentials", "defaultMode": 420}},
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": NAMESPACE_FIELD}]}},
                        ],
                    },
                },
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def pinned_pod(containers: int) -> dict[str, Any]:
    """The same pod after ``/mutate``: every non-GPU container carries ``NVIDIA_VISIBLE_DEVICES=void``."""
    pod = copy.deepcopy(typical_pod(containers))
    for body in pod["spec"]["containers"]:
        if "nvidia.com/gpu" not in body["resources"]["limits"]:
            body["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    return pod


def admission_review(pod: dict[str, Any], uid: str = "00000000-0000-4000-8000-000000000000") -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` CREATE request for ``pod``, shaped as the API server sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "4a1c4d2e-5b6f-4c7d-8e9f-0a1b2c3d4e5f",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def ephemeral_update(pod: dict[str, Any]) -> dict[str, Any]:
    """The UPDATE of ``pods/ephemeralcontainers`` that ``kubectl debug`` makes on ``pod``: the API server sends the
    pod twice (``object`` with the new ephemeral container, ``oldObject`` without), the largest reviews it sends."""
    old = copy.deepcopy(pod)
    old["metadata"]["name"] = "trainer-7d9f8b6c5-x2x7k"
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "debugger-7k2lq", "image": "busybox:1.36", "targetContainerName": "trainer", "stdin": True}
    ]
    review = admission_review(new)
    review["request"].update(
        name=old["metadata"]["name"],
        operation="UPDATE",
        subResource="ephemeralcontainers",
        requestSubResource="ephemeralcontainers",
        oldObject=old,
        options={"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
    )
    return review


def ephemeral_update_body(containers: int) -> bytes:
    return orjson.dumps(ephemeral_update(pinned_pod(containers)))


def densest_pod(env_entries: int, containers: int = 10) -> dict[str, Any]:
    """The pinned pod with ``env_entries`` short env entries in each container: the most Python objects per byte
    of JSON a pod takes (a parsed entry is a dict and two strings for about 20 bytes)."""
    pod = pinned_pod(containers)
    for body in pod["spec"]["containers"]:
        body["env"] = [{"name": f"E{number}", "value": ""} for number in range(env_entries)] + body["env"]
    return pod


def largest_review(limit: int) -> bytes:
    """The largest ephemeral-containers UPDATE of a densest pod that fits in ``limit`` bytes: the worst case for
    the memory a review takes (object and oldObject, each about half the limit)."""
    low, high = 0, 1
    while len(orjson.dumps(ephemeral_update(densest_pod(high)))) <= limit:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if len(orjson.dumps(ephemeral_update(densest_pod(middle)))) <= limit:
            low = middle
        else:
            high = middle
    return orjson.dumps(ephemeral_update(densest_pod(low)))


def mutate_body(containers: int) -> bytes:
    return orjson.dumps(admission_review(typical_pod(containers)))


def validate_body(containers: int) -> bytes:
    return orjson.dumps(admission_review(pinned_pod(containers)))


def floor_response(body: Any) -> dict[str, Any]:
    """The least a webhook can answer (allowed, uid echoed): what the floor measurements serialise."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": body["request"]["uid"], "allowed": True},
    }


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch of a ``/mutate`` response (empty when there is none)."""
    patch = response.get("response", {}).get("patch")
    return orjson.loads(base64.b64decode(patch)) if patch else []
