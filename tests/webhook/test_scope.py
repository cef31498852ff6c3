"""webhook.scope: which pods can land on a GPU node, against everything a pod author controls; and the policy's
use of it (node rules scoped, GPU rules not, an UPDATE that adds a toleration judged)."""

from __future__ import annotations

import copy

import pytest

from gpu_fence.webhook.config import GpuTaint, PolicyConfig, TaintEffect
from gpu_fence.webhook.policy import RULES, Reach, evaluate, validate, validate_update
from gpu_fence.webhook.scope import reaches_gpu_nodes, tolerates
from tests.fakes.pods import NVD, container, env, gpu_container, kai_fraction_pod, pod

GPU = GpuTaint("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE)
EVICTING = GpuTaint("sku", "gpu", TaintEffect.NO_EXECUTE)
SCOPED = PolicyConfig(gpu_node_taints=(GPU, EVICTING))


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}, GPU, True),
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, GPU, True),  # no operator: Equal
        ({"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}, GPU, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU, True),  # any value, any effect
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU, False),
        ({"operator": "Exists"}, GPU, True),  # no key: every taint (DaemonSets)
        ({"operator": "Exists", "effect": "NoSchedule"}, GPU, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, EVICTING, False),
        ({"key": "other", "operator": "Exists"}, GPU, False),
        ({"key": "nvidia.com/gpu", "operator": "Gt", "value": "0"}, GPU, True),  # an operator we do not read: counts
        ({"key": "nvidia.com/gpu", "operator": "Lt", "value": "9", "effect": "NoExecute"}, GPU, True),
        ("nvidia.com/gpu", GPU, True),  # not an object: counts
        ({"key": ["nvidia.com/gpu"], "operator": "Exists"}, GPU, True),
        ({"key": None, "operator": None, "value": None, "effect": None}, GPU, False),  # nulls are empty: Equal ""
    ],
)
def test_tolerates_reads_tolerations_as_the_api_does_and_counts_what_it_cannot_read(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected


@pytest.mark.parametrize(
    ("spec", "reaches"),
    [
        ({}, False),
        ({"tolerations": []}, False),
        ({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, False),
        ({"tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}]}, True),
        ({"tolerations": [{"operator": "Exists"}]}, True),
        ({"tolerations": "everything"}, True),
        ({"nodeName": "gpu-node-1"}, True),  # skips the scheduler; the kubelet checks only NoExecute taints
        ({"runtimeClassName": "kata"}, True),  # its class's tolerations are merged in by the API server
        ({"schedulerName": "my-scheduler"}, True),
        ({"schedulerName": "default-scheduler"}, False),
        ({"schedulerName": ""}, False),
        ({"schedulerName": ["default-scheduler"]}, True),
    ],
)
def test_what_a_pod_author_controls_counts_against_the_pod(spec, reaches):
    assert reaches_gpu_nodes(spec, SCOPED) is reaches


def test_without_taints_every_pod_reaches_gpu_nodes():
    assert reaches_gpu_nodes({}, PolicyConfig())
    aware = PolicyConfig(gpu_node_taints=(GPU,), taint_aware_schedulers=("default-scheduler", "kai-scheduler"))
    assert not reaches_gpu_nodes({"schedulerName": "kai-scheduler"}, aware)


NODE_RULES = {rule.id for rule in RULES if rule.reach is Reach.NODE}


def node_breaker(**spec) -> dict:
    """A CPU pod that breaks rules that guard the node (a privileged CI runner with the host's PID namespace) and one
    GPU rule (a visible-devices value)."""
    return pod(
        container("runner", environment=[env(NVD, "all")], securityContext={"privileged": True}),
        hostPID=True,
        **spec,
    )


def test_node_rules_are_scoped_and_gpu_rules_are_not():
    assert {
        "privileged",
        "sys-admin-capability",
        "added-capability",
        "host-pid",
        "runtime-annotation",
        "host-device-path",
        "host-path",
        "volume-type",
        "host-process",
        "host-ipc",
    } == NODE_RULES
    result = validate(node_breaker(), SCOPED)
    assert [v.rule for v in result.violations] == ["visible-devices-env"]
    assert {w.rule for w in result.warnings} == {"privileged", "host-pid"}
    assert all("tolerates none of gpu_node_taints" in w.message for w in result.warnings)


@pytest.mark.parametrize(
    "spec",
    [
        {"tolerations": [{"operator": "Exists"}]},
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        {"nodeName": "gpu-node-1"},
        {"runtimeClassName": "nvidia"},
        {"schedulerName": "custom"},
    ],
)
def test_each_way_onto_a_gpu_node_brings_the_node_rules_back(spec):
    rules = {v.rule for v in validate(node_breaker(**spec), SCOPED).violations}
    assert rules == {"visible-devices-env", "privileged", "host-pid"}


def test_an_update_that_adds_a_gpu_toleration_is_judged_by_the_node_rules():
    before = evaluate(node_breaker(), SCOPED, namespace="ci")
    assert before.verdict == "rejected"  # visible-devices-env: a GPU rule, scoped or not
    old = node_breaker()
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert {v.rule for v in validate_update(new, old, SCOPED).violations} == {"privileged", "host-pid"}
    # already in scope, another toleration added: nothing new to judge
    newer = copy.deepcopy(new)
    newer["spec"]["tolerations"].append({"operator": "Exists"})
    assert validate_update(newer, new, SCOPED).violations == ()
    # an unrelated toleration keeps it out of scope
    unrelated = copy.deepcopy(old)
    unrelated["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    assert validate_update(unrelated, old, SCOPED).violations == ()
    # without taints configured, tolerations mean nothing to gpu-fence
    assert validate_update(new, old, PolicyConfig()).violations == ()


def test_a_runtime_annotation_added_to_a_pod_out_of_scope_warns_and_a_cdi_one_is_denied():
    old = pod(container("app", environment=[env(NVD, "void")]))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"devices.crio.io": "/dev/nvidia0", "cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    result = validate_update(new, old, SCOPED)
    assert [v.rule for v in result.violations] == ["cdi-annotation"]
    assert [w.rule for w in result.warnings] == ["runtime-annotation"]


def test_a_debug_container_on_a_running_pod_is_judged_in_full():
    """A running pod has a nodeName (the scheduler's binding): its new ephemeral containers are judged as if it
    could be on a GPU node, whatever its tolerations."""
    running = pod(gpu_container("cuda"), nodeName="cpu-node-3")
    running["spec"]["ephemeralContainers"] = [
        container("debug", environment=[env(NVD, "void")], securityContext={"privileged": True})
    ]
    assert [v.rule for v in validate(running, SCOPED, only={"debug"}).violations] == ["privileged"]


GIT_REPO = {"name": "src", "gitRepo": {"repository": "https://example.com/repo.git"}}
HOST_PROCESS = {"windowsOptions": {"hostProcess": True}}


def node_reaching(**spec) -> dict:
    """A CPU pod that reaches only the node it runs on: a gitRepo volume the kubelet clones as root, the node's IPC
    namespace and /dev/shm, a Windows HostProcess container."""
    return pod(
        container("agent", environment=[env(NVD, "void")], securityContext=HOST_PROCESS),
        volumes=[GIT_REPO],
        hostIPC=True,
        **spec,
    )


def test_the_node_reaching_volume_and_namespace_rules_are_scoped():
    """volume-type, host-ipc and host-process reach the node a pod runs on: off a GPU node they warn."""
    result = validate(node_reaching(), SCOPED)
    assert result.violations == ()
    assert {w.rule for w in result.warnings} == {"volume-type", "host-process", "host-ipc"}
    rules = {v.rule for v in validate(node_reaching(tolerations=[{"operator": "Exists"}]), SCOPED).violations}
    assert rules == {"volume-type", "host-process", "host-ipc"}


def test_an_update_that_adds_a_gpu_toleration_brings_the_node_reaching_rules_back():
    old = node_reaching()
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    found = validate_update(new, old, SCOPED).violations
    assert {v.rule for v in found} == {"volume-type", "host-process", "host-ipc"}
    assert all("exempt_service_accounts" in v.way_out for v in found)  # node rules: the node agent's way out


def test_a_bound_gpu_pod_is_never_out_of_scope():
    """bound-gpu-pod guards the allocation, not the node: a GPU rule. Its nodeName puts it in scope anyway, and a
    scheduler gpu-fence takes for taint-aware changes nothing."""
    bound = pod(gpu_container(), nodeName="cpu-node-1")
    aware = PolicyConfig(gpu_node_taints=(GPU,), taint_aware_schedulers=("default-scheduler", "my-scheduler"))
    for config in (SCOPED, aware):
        [violation] = validate(bound, config).violations
        assert violation.rule == "bound-gpu-pod" and "kubernetes.io/hostname" in violation.fix
    assert validate(bound, SCOPED).warnings == ()


def test_a_gated_device_request_off_a_gpu_node_is_still_denied():
    asking = pod(gpu_container(environment=[env("NVIDIA_NVSWITCH", "enabled")]))
    assert not reaches_gpu_nodes(asking["spec"], SCOPED)
    assert [v.rule for v in validate(asking, SCOPED).violations] == ["gated-device-env"]


def test_a_kai_annotation_changed_on_a_pod_out_of_scope_is_still_denied():
    """KAI's pods name KAI's scheduler, which is not taken for taint-aware unless configured; where it is, a pod
    that tolerates no GPU taint is out of the node rules' scope, but KAI's binder still reads the annotations."""
    aware = PolicyConfig(gpu_node_taints=(GPU,), taint_aware_schedulers=("kai-scheduler",))
    old = kai_fraction_pod(gpu_container("main", gpus=None))
    assert not reaches_gpu_nodes(old["spec"], aware)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "attacker-bcdfghj-shared-gpu"
    new["metadata"]["annotations"]["devices.crio.io"] = "/dev/nvidia0"
    result = validate_update(new, old, aware)
    assert [v.rule for v in result.violations] == ["kai-annotation-update"]
    assert result.violations[0].fix == "delete the pod and create it with the annotations it needs"
    assert [w.rule for w in result.warnings] == ["runtime-annotation"]


def test_an_update_that_adds_a_toleration_and_changes_a_kai_annotation_is_judged_for_both():
    aware = PolicyConfig(gpu_node_taints=(GPU,), taint_aware_schedulers=("kai-scheduler",))
    old = kai_fraction_pod(gpu_container("main", gpus=None))
    old["spec"]["hostIPC"] = True
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = [{"operator": "Exists"}]
    new["metadata"]["annotations"]["gpu-fraction"] = "1.0"
    assert {v.rule for v in validate_update(new, old, aware).violations} == {"kai-annotation-update", "host-ipc"}
