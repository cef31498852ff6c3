"""webhook.scope: which pods can land on a GPU node, against everything a pod author controls; and the policy's
use of it (node rules scoped, GPU rules not, an UPDATE that adds a toleration judged)."""

from __future__ import annotations

import copy

import pytest

from gpu_fence.webhook.config import GpuTaint, PolicyConfig, TaintEffect
from gpu_fence.webhook.policy import RULES, Reach, evaluate, validate, validate_update
from gpu_fence.webhook.scope import reaches_gpu_nodes, tolerates
from tests.fakes.pods import NVD, container, env, gpu_container, pod

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
