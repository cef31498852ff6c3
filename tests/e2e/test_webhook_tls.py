"""End to end over real TLS: ``certs`` makes the CA and serving certificate, ``gpu-fence-webhook serve`` runs as a
subprocess (gunicorn with serve's own worker, as in production) on a loopback port, and real AdmissionReview v1
JSON goes over HTTPS, verified against the generated CA with the Service DNS name, exactly as the API server would
connect.

One server per module (starting it is the slow part); the certificate-renewal test runs last because it changes
the served certificate.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import shutil
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import jsonpatch
import kubernetes_validate
import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.webhook.reasons import BadRequestReason
from tests.fakes import pods
from tests.fakes.pods import as_kai_leaves_it, kai_fraction_pod, kai_reference
from tests.fakes.polling import in_a_row, wait_for
from tests.fakes.ports import free_port
from tests.fakes.processes import run_captured
from tests.fakes.webhook_server import BIN, NAMESPACE, Reply, Server, run_certs, send, serving

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parents[1] / "webhook" / "admissionreviews"


def fixture(name: str) -> dict:
    document = json.loads((FIXTURES / f"{name}.json").read_text())
    document["request"]["uid"] = str(uuid.uuid4())  # the API server sends a fresh uid per call
    return document


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("webhook"), env={"PYTHONPROFILEIMPORTTIME": "1"}) as started:
        yield started


def decoded_patch(reply: Reply) -> list[dict] | None:
    patch = reply.document["response"].get("patch")
    return None if patch is None else json.loads(base64.b64decode(patch))


def scrape(server: Server) -> dict[tuple, float]:
    reply = server.get("/metrics")
    assert reply.status == 200
    out = {}
    for family in text_string_to_metric_families(reply.document["text"]):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def reviews(samples: dict, endpoint: str, verdict: str, rule: str = "none") -> float:
    key = ("gpu_fence_webhook_reviews_total", (("endpoint", endpoint), ("rule", rule), ("verdict", verdict)))
    return samples.get(key, 0.0)


# -- the admission contract over HTTPS -------------------------------------------------------------------------


def test_mutate_returns_a_patch_that_yields_a_valid_pinned_pod_and_is_idempotent(server):
    review = fixture("pod-create-replicaset-gpu-mix")
    reply = server.post("/mutate", review)
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
    response = reply.document["response"]
    assert reply.document["apiVersion"] == "admission.k8s.io/v1" and reply.document["kind"] == "AdmissionReview"
    assert response["uid"] == review["request"]["uid"] and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    pod = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(reply))
    kubernetes_validate.validate(pod, desired_version="1.30", strict=True)
    containers = {c["name"]: c for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in containers["log-shipper"]["env"]
    assert containers["fetch-weights"]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert "env" not in containers["trainer"]  # the GPU container is left alone
    again = copy.deepcopy(review)
    again["request"]["object"] = pod
    second = server.post("/mutate", again)
    assert "patch" not in second.document["response"] and "patchType" not in second.document["response"]
    # and the mutated pod passes enforcement, while the original is denied naming rule, container and fix
    assert server.post("/validate", again).document["response"]["allowed"] is True
    denied = server.post("/validate", review).document["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    assert "unpinned-container" in denied["status"]["message"] and "log-shipper" in denied["status"]["message"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in denied["status"]["message"]
    assert denied["auditAnnotations"] == {"rules": "unpinned-container"}


def test_minimal_pod_without_env_gets_the_whole_env_array(server):
    review = fixture("pod-create-minimal")
    pod = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(server.post("/mutate", review)))
    assert pod["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_validate_denies_a_path_to_all_gpus(server):
    review = fixture("pod-create-kubectl")
    container = review["request"]["object"]["spec"]["containers"][0]
    container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    response = server.post("/validate", review).document["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "visible-devices-env" in response["auditAnnotations"]["rules"]
    assert container["name"] in response["status"]["message"]


def test_warn_mode_allows_with_short_warnings(server):
    review = fixture("pod-create-kubectl")
    review["request"]["object"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    response = server.post("/validate/warn", review).document["response"]
    assert response["allowed"] is True and "status" not in response
    assert response["warnings"] and all(len(w) <= 120 for w in response["warnings"])
    assert any(w.startswith("privileged") for w in response["warnings"])
    assert "patch" not in response


def test_ephemeral_container_update_judges_only_the_new_container(server):
    review = fixture("pod-update-ephemeralcontainers")
    reply = server.post("/mutate", review)
    patch = decoded_patch(reply)
    assert patch and all(op["path"].startswith("/spec/ephemeralContainers/1") for op in patch)
    pod = jsonpatch.apply_patch(review["request"]["object"], patch)
    assert pod["spec"]["ephemeralContainers"][1]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    denied = server.post("/validate", review).document["response"]
    assert denied["allowed"] is False and "debugger-abc12" in denied["status"]["message"]
    assert "log-shipper" not in denied["status"]["message"]  # not part of this update
    review["request"]["object"] = pod
    assert server.post("/validate", review).document["response"]["allowed"] is True


def test_dry_run_gets_the_same_answer(server):
    dry, wet = fixture("pod-create-dryrun"), fixture("pod-create-replicaset-gpu-mix")
    assert decoded_patch(server.post("/mutate", dry)) == decoded_patch(server.post("/mutate", wet))
    assert server.post("/validate", dry).document["response"]["allowed"] is False


def test_mirror_pods_and_exempt_namespaces_are_allowed_untouched(server):
    mirror = server.post("/mutate", fixture("pod-create-mirror")).document["response"]
    assert mirror["allowed"] is True and "patch" not in mirror and "exempt" in mirror["auditAnnotations"]
    own = fixture("pod-create-replicaset-gpu-mix")
    own["request"]["namespace"] = NAMESPACE  # the webhook's own namespace (--namespace) is always exempt
    response = server.post("/validate", own).document["response"]
    assert response["allowed"] is True and "exempt" in response["auditAnnotations"]


@pytest.mark.parametrize("name", ["pod-delete", "deployment-create"])
def test_other_operations_and_kinds_are_allowed_without_patch(server, name):
    review = fixture(name)
    for path in ("/mutate", "/validate"):
        assert server.post(path, review).document["response"] == {"uid": review["request"]["uid"], "allowed": True}


# -- each bypass class of the threat model's V11 and V15-V24, and the workloads that must keep working ----------

CUDA = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def review_of(
    document: dict, *, namespace: str = "default", operation: str = "CREATE", old: dict | None = None
) -> dict:
    """A real AdmissionReview (the kubectl CREATE fixture) carrying this pod."""
    review = fixture("pod-create-kubectl")
    request = review["request"]
    request.update(namespace=namespace, operation=operation, name=document["metadata"]["name"])
    request["object"] = {**document, "metadata": {**document["metadata"], "namespace": namespace}}
    request["oldObject"] = old
    return review


def bypass_pods() -> dict[str, tuple[dict, str]]:
    """One pod per bypass class (V11, V15-V21, V25, V27-V30) that the default policy rejects, with the rule that
    must say so."""
    kai_bound = as_kai_leaves_it(kai_fraction_pod(pods.container("app", image=CUDA)))
    kai_bound["spec"]["nodeName"] = "gpu-node-1"
    kai_elsewhere = as_kai_leaves_it(kai_fraction_pod(pods.container("app", image=CUDA)))
    kai_elsewhere["spec"]["containers"][0]["env"][0] = kai_reference(name="mine")
    claim = pods.pod(
        pods.container("app", image=CUDA, environment=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    )
    claim["spec"]["containers"][0]["resources"] = {"claims": [{"name": "nic"}]}
    claim["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "rdma-nic"}]
    pinned = {"image": CUDA, "environment": [VOID]}
    return {
        "kai fraction pod created bound to a node": (kai_bound, "visible-devices-env"),
        "kai reference to another ConfigMap": (kai_elsewhere, "visible-devices-env"),
        "dra claim for a nic with all GPUs": (claim, "visible-devices-env"),
        "hostPath /proc/1/root": (pods.host_path_pod("/proc/1/root"), "host-device-path"),
        "hostPath /sys/fs/cgroup": (pods.host_path_pod("/sys/fs/cgroup"), "host-device-path"),
        "hostPath /etc/kubernetes/manifests": (pods.host_path_pod("/etc/kubernetes/manifests"), "host-device-path"),
        "writable hostPath off the allowlist": (pods.host_path_pod("/srv/shared"), "host-path"),
        "SYS_PTRACE beside a GPU container's processes": (
            pods.pod(
                pods.gpu_container("cuda"),
                pods.container("debugger", **pinned, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}),
                shareProcessNamespace=True,
            ),
            "added-capability",
        ),
        "NET_ADMIN in the node's network namespace": (
            pods.pod(
                pods.gpu_container("cuda", securityContext={"capabilities": {"add": ["NET_ADMIN"]}}), hostNetwork=True
            ),
            "added-capability",
        ),
        "PERFMON": (
            pods.pod(pods.gpu_container("cuda", securityContext={"capabilities": {"add": ["PERFMON"]}})),
            "added-capability",
        ),
        "DAC_READ_SEARCH": (
            pods.pod(pods.container("app", **pinned, securityContext={"capabilities": {"add": ["DAC_READ_SEARCH"]}})),
            "added-capability",
        ),
        "hostPID": (pods.pod(pods.gpu_container("cuda"), hostPID=True), "host-pid"),
        "CRI-O device annotation": (
            pods.pod(pods.container("app", **pinned), annotations={"io.kubernetes.cri-o.Devices": "/dev/nvidia0"}),
            "runtime-annotation",
        ),
        "NRI device injection": (
            pods.pod(
                pods.container("app", **pinned), annotations={"devices.noderesource.dev/pod": "- path: /dev/nvidia0"}
            ),
            "runtime-annotation",
        ),
        "IMEX channels": (
            pods.pod(pods.gpu_container("cuda", environment=[{"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}])),
            "imex-channels-env",
        ),
        "an unadvertised GPU resource on a pod created bound to a node": (
            pods.pod(pods.gpu_container("cuda", resource="nvidia.com/gpu.shared"), nodeName="gpu-node-1"),
            "bound-gpu-pod",
        ),
        "NVSwitch devices": (
            pods.pod(pods.gpu_container("cuda", environment=[{"name": "NVIDIA_NVSWITCH", "value": "enabled"}])),
            "gated-device-env",
        ),
        "gitRepo volume": (
            pods.pod(pods.gpu_container("cuda"), volumes=[{"name": "r", "gitRepo": {"repository": "https://x/r"}}]),
            "volume-type",
        ),
        "inline iSCSI volume": (
            pods.pod(
                pods.gpu_container("cuda"),
                volumes=[{"name": "d", "iscsi": {"targetPortal": "10.0.0.2:3260", "iqn": "iqn.2001-04.x:y", "lun": 0}}],
            ),
            "volume-type",
        ),
        "Windows HostProcess": (
            pods.pod(
                pods.container("agent", **pinned),
                hostNetwork=True,
                securityContext={"windowsOptions": {"hostProcess": True}},
            ),
            "host-process",
        ),
        "hostIPC": (pods.pod(pods.gpu_container("cuda"), hostIPC=True), "host-ipc"),
    }


@pytest.mark.parametrize("name", sorted(bypass_pods()))
def test_each_class_of_bypass_is_denied_over_https(server, name):
    document, rule = bypass_pods()[name]
    review = review_of(document)
    response = server.post("/validate", review).document["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert rule in response["auditAnnotations"]["rules"].split(",")
    assert f"{rule}: " in response["status"]["message"]  # the clause names its rule, as every denial does
    warned = server.post("/validate/warn", review).document["response"]
    assert warned["allowed"] is True and any(w.startswith(rule) for w in warned["warnings"])


def test_a_plain_update_that_adds_a_runtime_device_annotation_is_denied(server):
    before = pods.pod(pods.gpu_container("cuda"), name="running")
    after = copy.deepcopy(before)
    after["metadata"]["annotations"] = {"mounts.noderesource.dev/container.cuda": "- source: /\n  destination: /host"}
    review = review_of(after, operation="UPDATE", old=before)
    response = server.post("/validate", review).document["response"]
    assert response["allowed"] is False and response["auditAnnotations"]["rules"] == "runtime-annotation"
    review["request"]["object"] = {**before, "metadata": {**before["metadata"], "namespace": "default"}}
    assert server.post("/validate", review).document["response"]["allowed"] is True


def test_an_update_that_retargets_kai_s_binder_is_denied_and_kai_s_own_updates_are_not(server):
    """The pod as KAI's webhook leaves it, behind a scheduling gate; then its ConfigMap prefix changed, its fraction
    removed (403 for the UPDATE), and the binder's own bind-time patch (allowed)."""
    created = as_kai_leaves_it(kai_fraction_pod(pods.container("app", image=CUDA)))
    created["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    annotations = created["metadata"]["annotations"]
    retargeted = {**annotations, "runai/shared-gpu-configmap": "app-bcdfghj-shared-gpu"}
    unfractioned = {k: v for k, v in annotations.items() if k != "gpu-fraction"}
    for changed in (retargeted, unfractioned):
        after = {**created, "metadata": {**created["metadata"], "annotations": changed}}
        review = review_of(after, operation="UPDATE", old=created)
        response = server.post("/validate", review).document["response"]
        assert response["allowed"] is False and response["status"]["code"] == 403
        assert response["auditAnnotations"]["rules"] == "kai-annotation-update"
        assert "delete the pod" in response["status"]["message"]
    bound = {**annotations, "received-resource-type": "Fraction", "pod-group-name": "pg-app"}
    after = {**created, "metadata": {**created["metadata"], "annotations": bound}}
    assert (
        server.post("/validate", review_of(after, operation="UPDATE", old=created)).document["response"]["allowed"]
        is True
    )


def test_the_node_reaching_round_3_rules_name_the_node_agent_way_out_and_warn_in_short_lines(server):
    """volume-type, host-process and host-ipc guard the node: a denial says the node agent's exemption once, and warn
    mode leads each warning with its rule id and fix, in lines of at most 120 characters."""
    agent = pods.pod(
        pods.container("agent", image=CUDA, securityContext={"windowsOptions": {"hostProcess": True}}),
        volumes=[{"name": "repo", "gitRepo": {"repository": "https://example.com/agent-config.git"}}],
        hostIPC=True,
        serviceAccountName="node-agent",
    )
    review = review_of(agent, namespace="ops")
    pinned = copy.deepcopy(review)
    pinned["request"]["object"] = jsonpatch.apply_patch(
        review["request"]["object"], decoded_patch(server.post("/mutate", review))
    )
    denied = server.post("/validate", pinned).document["response"]
    assert denied["allowed"] is False
    assert denied["auditAnnotations"]["rules"].split(",") == ["volume-type", "host-process", "host-ipc"]
    assert denied["status"]["message"].count('add "ops/node-agent" to exempt_service_accounts') == 1
    warned = server.post("/validate/warn", review).document["response"]
    lines = warned["warnings"]
    assert warned["allowed"] is True and all(len(line) <= 120 for line in lines)
    assert {line.split(":")[0] for line in lines if not line.startswith(" ")} >= {
        "volume-type",
        "host-process",
        "host-ipc",
        "gpu-fence",
    }
    assert any("init container into an emptyDir" in line for line in lines)  # gitRepo's own fix, not cut off
    assert any(line.startswith("gpu-fence: enforce mode would pin 1 container") for line in lines)


def kubectl_debug_review(profile: str) -> dict:
    """``kubectl debug -it trainer --image=busybox --target=cuda --profile=...`` as the API server sends it: an
    UPDATE of pods/ephemeralcontainers of a running GPU pod (kubernetes/kubectl pkg/cmd/debug/profiles.go: the
    general profile adds SYS_PTRACE, baseline adds nothing)."""
    running = pods.pod(pods.gpu_container("cuda", environment=[]), name="trainer", nodeName="gpu-node-1")
    debugged = copy.deepcopy(running)
    debug = pods.container("debugger-x7k2q", image="busybox:1.36", targetContainerName="cuda", stdin=True, tty=True)
    if profile == "general":
        debug["securityContext"] = {"capabilities": {"add": ["SYS_PTRACE"]}}
    debugged["spec"]["ephemeralContainers"] = [debug]
    review = review_of(debugged, operation="UPDATE", old=running)
    review["request"]["subResource"] = "ephemeralcontainers"
    return review


def test_kubectl_debug_into_a_gpu_container_needs_the_baseline_profile(server):
    """The decision of docs/policy.md: the default profile's SYS_PTRACE into a GPU container's processes is denied,
    naming --profile=baseline; the baseline profile's debug container is pinned and admitted."""
    answers = {}
    for profile in ("general", "baseline"):
        review = kubectl_debug_review(profile)
        patch = decoded_patch(server.post("/mutate", review))
        assert patch and all(op["path"].startswith("/spec/ephemeralContainers/0") for op in patch)
        review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], patch)
        answers[profile] = server.post("/validate", review).document["response"]
    denied = answers["general"]
    assert denied["allowed"] is False and denied["auditAnnotations"]["rules"] == "added-capability"
    assert "--profile=baseline" in denied["status"]["message"]
    assert answers["baseline"]["allowed"] is True


SCOPED_POLICY = """\
gpu_node_taints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
taint_aware_schedulers: [default-scheduler, kai-scheduler]
"""


@contextmanager
def serving_policy(tmp_path_factory, name: str, policy: str) -> Iterator[Server]:
    """A webhook of its own, serving this policy.yaml (``serve --config``)."""
    tmp = tmp_path_factory.mktemp(name)
    config = tmp / "policy.yaml"
    config.write_text(policy)
    with serving(tmp, "--config", str(config)) as started:
        yield started


@pytest.fixture(scope="module")
def scoped_server(tmp_path_factory) -> Iterator[Server]:
    """A webhook whose policy scopes the node rules to pods that can land on a GPU node (``gpu_node_taints``)."""
    with serving_policy(tmp_path_factory, "scoped", SCOPED_POLICY) as started:
        yield started


def test_the_taint_scope_relaxes_node_rules_never_the_gpu_rules(scoped_server):
    """Out of scope, hostIPC warns; a KAI annotation changed on the same pod is denied all the same, and an update
    that also adds a GPU toleration is denied for both."""
    created = as_kai_leaves_it(kai_fraction_pod(pods.container("app", image=CUDA)))
    del created["spec"]["runtimeClassName"]  # a runtime class alone would put it in scope
    created["spec"]["hostIPC"] = True
    created["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    at_create = scoped_server.post("/validate", review_of(created)).document["response"]
    assert at_create["allowed"] is True and any(w.startswith("host-ipc") for w in at_create["warnings"])
    retargeted = copy.deepcopy(created)
    retargeted["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "app-bcdfghj-shared-gpu"
    response = scoped_server.post("/validate", review_of(retargeted, operation="UPDATE", old=created)).document
    assert response["response"]["auditAnnotations"]["rules"] == "kai-annotation-update"
    tolerating = copy.deepcopy(retargeted)
    tolerating["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    response = scoped_server.post("/validate", review_of(tolerating, operation="UPDATE", old=created)).document
    assert response["response"]["allowed"] is False
    assert response["response"]["auditAnnotations"]["rules"] == "kai-annotation-update,host-ipc"


def admitted(server: Server, document: dict, *, after_mutation=lambda pod: pod, namespace: str = "default") -> dict:
    """/mutate, the patch applied (then whatever else mutates the pod), a schema check, /validate: the pod."""
    review = review_of(document, namespace=namespace)
    reply = server.post("/mutate", review)
    assert reply.document["response"]["allowed"] is True
    patch = decoded_patch(reply)
    pod = after_mutation(jsonpatch.apply_patch(review["request"]["object"], patch) if patch else document)
    pods.assert_valid_pod(pod)
    final = review_of(pod, namespace=namespace)
    response = server.post("/validate", final).document["response"]
    assert response["allowed"] is True, response
    assert server.post("/mutate", final).document["response"].get("patch") is None  # nothing left to pin
    return pod


def test_a_dra_gpu_claim_is_pinned_and_admitted(server):
    document = pods.pod(pods.container("ctr", image=CUDA))
    document["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    document["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    pod = admitted(server, document)
    assert pod["spec"]["containers"][0]["env"] == [VOID]


def test_a_kai_fraction_pod_is_admitted_after_kai_s_webhook_replaces_the_pin(server):
    authored = kai_fraction_pod(pods.container("gpu-workload", image=CUDA), pods.container("sidecar", image=CUDA))
    pod = admitted(server, authored, after_mutation=as_kai_leaves_it)
    workload, sidecar = pod["spec"]["containers"]
    assert [e for e in workload["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"] == [kai_reference()]
    assert sidecar["env"] == [VOID]
    assert pod["spec"]["runtimeClassName"] == "nvidia"


def test_a_gpu_pod_with_cpu_sidecars_and_multi_node_nccl_training_are_admitted(server):
    worker = pods.gpu_container(
        "trainer",
        gpus=8,
        securityContext={"capabilities": {"add": ["IPC_LOCK"]}},
        volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
    )
    nccl = pods.pod(
        worker,
        pods.container("metrics", image=CUDA),
        hostNetwork=True,
        dnsPolicy="ClusterFirstWithHostNet",
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    )
    pod = admitted(server, nccl)
    assert "env" not in pod["spec"]["containers"][0] and pod["spec"]["containers"][1]["env"] == [VOID]


def test_the_workloads_the_round_3_rules_must_keep_admitting(server):
    """GPU quantities written 1000m and 1e0; a LeaderWorkerSet's CPU leader and GPU worker; a GPU pod with its own
    user namespace; a trainer with a native sidecar and a shared process namespace; kubectl debug into a GPU pod."""
    for amount in ("1000m", "1e0"):
        pod = admitted(server, pods.pod(pods.gpu_container("cuda", gpus=amount)))
        assert "env" not in pod["spec"]["containers"][0]  # a GPU container: not pinned
    leader = admitted(server, pods.pod(pods.container("leader", image=CUDA), subdomain="lws"))
    assert leader["spec"]["containers"][0]["env"] == [VOID]
    admitted(server, pods.pod(pods.gpu_container("worker", gpus=8), subdomain="lws"))
    admitted(server, pods.pod(pods.gpu_container("cuda"), hostUsers=False))
    trainer = pods.pod(
        pods.gpu_container("trainer", gpus=8),
        init=[pods.container("log-shipper", image=CUDA, restartPolicy="Always")],
        shareProcessNamespace=True,
    )
    assert admitted(server, trainer)["spec"]["initContainers"][0]["env"] == [VOID]
    running = admitted(server, pods.pod(pods.gpu_container("cuda"), nodeSelector={"kubernetes.io/hostname": "n1"}))
    running["spec"]["nodeName"] = "n1"  # bound by the scheduler since
    debugged = copy.deepcopy(running)
    debugged["spec"]["ephemeralContainers"] = [pods.container("debugger", image=CUDA)]
    review = review_of(debugged, operation="UPDATE", old=running)
    review["request"]["subResource"] = "ephemeralcontainers"
    patch = decoded_patch(server.post("/mutate", review))
    assert patch and all(op["path"].startswith("/spec/ephemeralContainers/0") for op in patch)
    review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], patch)
    assert server.post("/validate", review).document["response"]["allowed"] is True


def test_an_exempt_monitoring_daemonset_pod_is_admitted_untouched(server):
    exporter = pods.pod(
        pods.container(
            "dcgm-exporter",
            image="nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
            environment=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            securityContext={"capabilities": {"add": ["SYS_ADMIN"]}},
            volumeMounts=[{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}],
        ),
        hostPID=True,
        volumes=[{"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}],
    )
    for path in ("/mutate", "/validate"):
        response = server.post(path, review_of(exporter, namespace="kube-system")).document["response"]
        assert response["allowed"] is True and "patch" not in response and "exempt" in response["auditAnnotations"]
    assert server.post("/validate", review_of(exporter)).document["response"]["allowed"] is False


def test_env_from_on_a_gpu_container_and_a_user_set_none_warn_by_default(server):
    document = pods.pod(
        pods.gpu_container("cuda", envFrom=[{"configMapRef": {"name": "settings"}}]),
        pods.container("tools", image=CUDA, environment=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]),
    )
    response = server.post("/validate", review_of(document)).document["response"]
    warnings = response["warnings"]
    assert response["allowed"] is True and all(len(w) <= 120 for w in warnings)
    # one warning each, led by its rule id; what does not fit in 120 characters goes on in the next line
    assert [w.split(":")[0] for w in warnings if not w.startswith(" ")] == ["gpu-env-from", "visible-devices-none"]
    said = " ".join(w.strip() for w in warnings)
    assert "with env instead of envFrom" in said and "use void" in said


CONFIGURED_POLICY = """\
visible_devices_aliases: [DOCKER_RESOURCE_GPU]
host_path_allowlist:
  - {path: /dev/infiniband, writable: false}
  - {path: /tmp/nvidia-mps, writable: true}
env_from_on_gpu_containers: reject
visible_devices_none: reject
"""


@pytest.fixture(scope="module")
def configured_server(tmp_path_factory) -> Iterator[Server]:
    """A second webhook, serving a policy.yaml that sets the allowlist, aliases and switches (``serve --config``)."""
    with serving_policy(tmp_path_factory, "configured", CONFIGURED_POLICY) as started:
        yield started


def test_configured_aliases_are_pinned_beside_the_variable(configured_server):
    pod = admitted(configured_server, pods.pod(pods.gpu_container("cuda"), pods.container("sidecar", image=CUDA)))
    assert pod["spec"]["containers"][1]["env"] == [VOID, {"name": "DOCKER_RESOURCE_GPU", "value": "void"}]
    unpinned_alias = pods.pod(pods.container("sidecar", image=CUDA, environment=[VOID]))
    denied = configured_server.post("/validate", review_of(unpinned_alias)).document["response"]
    assert denied["allowed"] is False and "DOCKER_RESOURCE_GPU" in denied["status"]["message"]


def test_configured_switches_reject(configured_server):
    env_from = pods.pod(pods.gpu_container("cuda", envFrom=[{"configMapRef": {"name": "settings"}}]))
    none = pods.pod(
        pods.container("tools", image=CUDA, environment=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])
    )
    none["spec"]["containers"][0]["env"].append({"name": "DOCKER_RESOURCE_GPU", "value": "void"})
    for document, rule in ((env_from, "gpu-env-from"), (none, "visible-devices-none")):
        response = configured_server.post("/validate", review_of(document)).document["response"]
        assert response["allowed"] is False and response["auditAnnotations"]["rules"] == rule
        assert "warnings" not in response


def test_configured_allowlist_admits_rdma_devices_read_only_only(configured_server):
    read_only = pods.host_path_pod("/dev/infiniband")
    read_only["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = True
    admitted(configured_server, read_only)
    writable = configured_server.post("/validate", review_of(pods.host_path_pod("/dev/infiniband"))).document
    assert writable["response"]["allowed"] is False
    assert "host-path" in writable["response"]["auditAnnotations"]["rules"].split(",")
    admitted(configured_server, pods.host_path_pod("/tmp/nvidia-mps"))


# -- bad input: a clear JSON 4xx, never a 500 or a traceback ---------------------------------------------------


def _bad_cases() -> list[tuple[str, bytes, str | None, int, str]]:
    no_uid = fixture("pod-create-kubectl")
    del no_uid["request"]["uid"]
    wrong_kind = fixture("pod-create-kubectl") | {"kind": "Pod"}
    return [
        ("/validate", b"this is not json", "application/json", 400, BadRequestReason.INVALID_JSON),
        (
            "/validate",
            json.dumps(fixture("pod-create-kubectl")).encode(),
            "text/plain",
            415,
            BadRequestReason.WRONG_CONTENT_TYPE,
        ),
        (
            "/validate",
            json.dumps(fixture("pod-create-kubectl")).encode(),
            None,
            415,
            BadRequestReason.WRONG_CONTENT_TYPE,
        ),
        (
            "/validate",
            (FIXTURES / "pod-create-v1beta1.json").read_bytes(),
            "application/json",
            400,
            BadRequestReason.WRONG_API_VERSION,
        ),
        ("/mutate", json.dumps(wrong_kind).encode(), "application/json", 400, BadRequestReason.WRONG_KIND),
        (
            "/mutate",
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
            "application/json",
            400,
            BadRequestReason.MISSING_REQUEST,
        ),
        ("/validate/warn", json.dumps(no_uid).encode(), "application/json", 400, BadRequestReason.MISSING_UID),
        ("/validate", b"", "application/json", 400, BadRequestReason.EMPTY_BODY),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda case: case[4])
def test_bad_input_is_a_clear_json_4xx(server, case):
    path, body, content_type, status, reason = case
    reply = server.post(path, body, content_type=content_type)
    assert reply.status == status
    assert reply.document["error"] == reason and reply.document["message"]
    assert "Traceback" not in json.dumps(reply.document)


def test_body_over_3_mib_is_413(server):
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","pad":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    reply = server.post("/validate", body)
    assert reply.status == 413 and reply.document["error"] == BadRequestReason.BODY_TOO_LARGE


def test_unknown_paths_and_methods_are_json(server):
    assert server.get("/admit").status == 404 and server.get("/admit").document["error"] == BadRequestReason.NOT_FOUND
    reply = server.get("/validate")
    assert reply.status == 405 and reply.document["error"] == BadRequestReason.METHOD_NOT_ALLOWED


def test_tls_1_2_and_1_3_are_served_with_keep_alive(server):
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = ssl.create_default_context(cafile=str(server.tls_dir / "ca.crt"))
        context.minimum_version = context.maximum_version = version
        conn = server.connect(context)
        try:
            assert send(conn, "GET", "/healthz").status == 200
            first = conn.sock
            assert send(conn, "POST", "/validate", json.dumps(fixture("pod-create-kubectl")).encode()).status == 200
            assert conn.sock is first  # the same connection: kept alive between reviews
            assert first.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
        finally:
            conn.close()


def test_health_endpoints(server):
    assert server.get("/healthz").document == {"status": "ok"}
    assert server.get("/readyz").document == {"status": "ready"}


# -- metrics, logs, imports ------------------------------------------------------------------------------------


def test_metrics_merge_all_workers(server):
    before = scrape(server)
    for _ in range(12):  # a fresh connection each: with several workers, the kernel spreads them
        server.post("/validate", fixture("pod-create-replicaset-gpu-mix"))
        server.post("/mutate", fixture("pod-create-replicaset-gpu-mix"))
    server.post("/validate", b"{", content_type="application/json")
    after = scrape(server)
    assert (
        reviews(after, "validate", "denied", "unpinned-container")
        - reviews(before, "validate", "denied", "unpinned-container")
        == 12
    )
    assert reviews(after, "mutate", "patched") - reviews(before, "mutate", "patched") == 12
    key = ("gpu_fence_webhook_bad_requests_total", (("reason", BadRequestReason.INVALID_JSON),))
    assert after[key] - before.get(key, 0) == 1
    count = ("gpu_fence_webhook_review_duration_seconds_count", (("endpoint", "validate"),))
    assert after[count] - before.get(count, 0) == 12
    leaf = x509.load_pem_x509_certificate((server.tls_dir / "tls.crt").read_bytes())
    expiry = after[("gpu_fence_webhook_certificate_expiry_timestamp_seconds", ())]
    assert expiry == leaf.not_valid_after_utc.timestamp()


def test_logs_are_json_lines_and_the_kubernetes_client_is_never_imported(server):
    review = fixture("pod-create-dryrun")
    server.post("/validate", review)

    def logged() -> list[str]:
        lines = server.stderr_lines()
        events = [json.loads(line) for line in lines if not line.startswith("import time:")]
        return lines if any(event.get("uid") == review["request"]["uid"] for event in events) else []

    lines = wait_for(logged, "the review event to be logged", timeout=10)
    events = [json.loads(line) for line in lines if not line.startswith("import time:")]
    [event] = [event for event in events if event.get("uid") == review["request"]["uid"]]
    assert event["event"] == "review" and event["verdict"] == "denied" and event["dry_run"] is True
    assert event["rules"] == ["unpinned-container"] and event["namespace"] == "default"
    assert list(event)[:5] == ["time", "level", "logger", "event", "message"] and event["level"] == "info"
    # no access log: the review lines say more
    assert not [other for other in events if other["logger"] == "gunicorn.access"]
    # gc.freeze() before each fork (serve's pre_fork hook): every worker starts with the master's objects frozen
    # and its own collector on
    started = [event for event in events if event["event"] == "worker-started"]
    assert len(started) >= len(server.workers()) >= 1
    assert all(event["frozen_objects"] > 10_000 and event["gc_enabled"] is True for event in started)
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    assert "flask" in imported and "gpu_fence.webhook.app" in imported  # the import log is live
    assert not [name for name in imported if name == "kubernetes" or name.startswith("kubernetes.")]


# -- errors at start -------------------------------------------------------------------------------------------


def _serve_fails(tmp_path: Path, *extra: str) -> str:
    command = [str(BIN / "gpu-fence-webhook"), "serve", "--bind", "127.0.0.1", "--port", str(free_port()), *extra]
    result = run_captured(command, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    return result.stderr


def test_serve_refuses_missing_or_mismatched_certificates_and_bad_config(tmp_path, server):
    err = _serve_fails(tmp_path, "--cert-file", str(tmp_path / "nope.crt"), "--key-file", str(tmp_path / "nope.key"))
    assert "cannot read" in err and "nope.crt" in err
    other = tmp_path / "other"
    run_certs(other)
    err = _serve_fails(tmp_path, "--cert-file", str(server.tls_dir / "tls.crt"), "--key-file", str(other / "tls.key"))
    assert "not a matching PEM certificate and key" in err
    config = tmp_path / "config.yaml"
    config.write_text("gpu_resourcez: [nvidia.com/gpu]\n")
    err = _serve_fails(
        tmp_path,
        "--cert-file",
        str(server.tls_dir / "tls.crt"),
        "--key-file",
        str(server.tls_dir / "tls.key"),
        "--config",
        str(config),
    )
    assert "gpu_resourcez" in err


# -- certificate renewal during traffic (last: it changes the served certificate) ------------------------------


def test_certificate_renewal_during_traffic_drops_nothing_and_serves_the_new_cert(server, tmp_path):
    renewed = tmp_path / "renewed"
    run_certs(renewed)  # a new CA too: clients trust old + new, as a caBundle does during a rotation
    both = ssl.create_default_context(cadata=(server.tls_dir / "ca.crt").read_text() + (renewed / "ca.crt").read_text())
    old_serial = x509.load_pem_x509_certificate((server.tls_dir / "tls.crt").read_bytes()).serial_number
    new_serial = x509.load_pem_x509_certificate((renewed / "tls.crt").read_bytes()).serial_number
    server.context = both  # from here on the server may present either certificate

    kept_alive = server.connect(both)
    assert send(kept_alive, "GET", "/healthz").status == 200
    assert kept_alive.peer_serial() == old_serial

    stop = threading.Event()
    failures: list[str] = []
    answered = [0]

    def traffic() -> None:
        conn = server.connect(both)
        while not stop.is_set():
            try:
                reply = send(conn, "POST", "/validate", json.dumps(fixture("pod-create-replicaset-gpu-mix")).encode())
                if reply.status != 200 or reply.document["response"]["allowed"] is not False:
                    failures.append(f"unexpected reply {reply.status}")
                answered[0] += 1
                if answered[0] % 5 == 0:  # mix in fresh connections (new handshakes) with keep-alive reuse
                    conn.close()
                    conn = server.connect(both)
            except (OSError, http.client.HTTPException) as error:
                failures.append(repr(error))
                conn.close()
                conn = server.connect(both)
        conn.close()

    def answered_at_least(count: int) -> Callable[[], bool]:
        def check() -> bool:
            assert not failures, failures
            return answered[0] >= count

        return check

    threads = [threading.Thread(target=traffic) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        wait_for(answered_at_least(20), "20 reviews answered", timeout=10, interval=0.01)
        # replace the pair the way `certs` and a Secret volume do: atomic renames, key first
        for name in ("tls.key", "tls.crt"):
            staging = server.tls_dir / f".{name}.new"
            shutil.copyfile(renewed / name, staging)
            os.replace(staging, server.tls_dir / name)

        # every worker checks the files at most once a second: wait until fresh connections, whichever worker
        # takes them, all get the new certificate
        def renewed_served() -> bool:
            fresh = server.connect(both)
            try:
                send(fresh, "GET", "/healthz")
                return fresh.peer_serial() == new_serial
            finally:
                fresh.close()

        # a connection that fails is a failure of the renewal, not a "not yet": nothing is retried
        wait_for(in_a_row(renewed_served, 8), "every worker to serve the renewed certificate", timeout=20, not_yet=())
        wait_for(answered_at_least(answered[0] + 20), "20 more reviews answered after the renewal", timeout=10)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=20)
    assert failures == []
    # the connection opened before the renewal is still alive and still on the old certificate
    assert send(kept_alive, "GET", "/healthz").status == 200
    assert kept_alive.peer_serial() == old_serial
    kept_alive.close()
    # clients that trust only the new CA now connect fine
    only_new = ssl.create_default_context(cafile=str(renewed / "ca.crt"))
    conn = server.connect(only_new)
    assert send(conn, "GET", "/readyz").status == 200
    conn.close()
    expiry = scrape(server)[("gpu_fence_webhook_certificate_expiry_timestamp_seconds", ())]
    assert expiry == x509.load_pem_x509_certificate((renewed / "tls.crt").read_bytes()).not_valid_after_utc.timestamp()
