"""The policy over real public manifests (saved under data/, sources in data/SOURCES.tsv): GPU workloads of every
allocation style pass, their non-GPU sidecars get pinned (and so do the containers that get their GPU through a
DRA claim or KAI's reference, which the pin does not take away), and NVIDIA's own system pods are rejected unless
the cluster exempts them by namespace or service account."""

from __future__ import annotations

import pytest

from gpu_fence.webhook.config import HostPathEntry, PolicyConfig
from gpu_fence.webhook.policy import evaluate, mutate
from tests.fakes.pods import (
    NVD,
    all_containers,
    apply_patch,
    as_kai_leaves_it,
    assert_valid_pod,
    env_of,
    kai_reference,
    manifest_pods,
)


def decide(filename: str, config: PolicyConfig, namespace: str = "default"):
    return [(p, evaluate(p, config, namespace=namespace)) for p in manifest_pods(filename)]


@pytest.mark.parametrize(
    "filename",
    [
        "NVIDIA__gpu-operator__tests__gpu-pod.yaml",
        "NVIDIA__k8s-device-plugin__testdata__job-1.yaml",
        "Project-HAMi__HAMi__examples__nvidia__default_use.yaml",
    ],
)
def test_gpu_workloads_pass_untouched(config, filename):
    decisions = decide(filename, config)
    assert decisions
    for _, decision in decisions:
        assert decision.verdict == "allowed", decision


@pytest.mark.parametrize(
    ("filename", "pinned"),
    [
        (
            "NVIDIA__KAI-Scheduler__docs__gpu-sharing__gpu-sharing-non-default-container.yaml",
            ("sidecar", "gpu-workload", "another-sidecar"),
        ),
        (
            "vllm-project__production-stack__src__gateway_inference_extension__configs__vllm__gpu-deployment.yaml",
            ("lora-adapter-syncer",),
        ),
    ],
)
def test_non_gpu_sidecars_of_gpu_workloads_are_pinned(config, filename, pinned):
    [(document, decision)] = decide(filename, config)
    assert decision.verdict == "mutated"
    assert decision.mutation.pinned == pinned
    patched = apply_patch(document, decision.mutation.patch)
    assert_valid_pod(patched)
    for body in all_containers(patched):
        assert (env_of(body).get(NVD) == "void") is (body["name"] in pinned)
    assert mutate(patched, config).patch == ()


def test_dra_claim_pods_are_pinned_and_nothing_else(config):
    """NVIDIA's DRA quickstart: each claim container gets the pin, which its CDI spec sets again (void) while
    delivering the claimed GPU as CDI device nodes, so the pin costs it nothing."""
    decisions = decide("NVIDIA__k8s-dra-driver-gpu__demo__specs__quickstart__v1__gpu-test1.yaml", config)
    assert [d.verdict for _, d in decisions] == ["mutated", "mutated"]
    for document, decision in decisions:
        patched = apply_patch(document, decision.mutation.patch)
        assert_valid_pod(patched)
        assert all(env_of(body) == {NVD: "void"} for body in all_containers(patched))
        assert evaluate(patched, config, namespace="default").verdict == "allowed"


@pytest.mark.parametrize(
    "filename",
    [
        "NVIDIA__KAI-Scheduler__docs__gpu-sharing__gpu-sharing.yaml",
        "NVIDIA__KAI-Scheduler__docs__gpu-sharing__gpu-sharing-non-default-container.yaml",
    ],
)
def test_kai_fraction_pods_are_admitted_as_kai_leaves_them(config, filename):
    """gpu-fence's webhook runs first (its configuration name sorts before KAI's): it pins every container; KAI's
    then replaces the fraction container's pin with its reference, which validation accepts."""
    [(document, decision)] = decide(filename, config)
    assert decision.verdict == "mutated"
    after_kai = as_kai_leaves_it(apply_patch(document, decision.mutation.patch))
    assert_valid_pod(after_kai)
    final = evaluate(after_kai, config, namespace="default")
    assert final.verdict == "allowed", final
    fraction = [c for c in all_containers(after_kai) if c["name"] == "gpu-workload"]
    [entry] = [e for e in fraction[0]["env"] if e["name"] == NVD]
    index = [c["name"] for c in after_kai["spec"]["containers"]].index("gpu-workload")
    assert entry == kai_reference(index=index)


def test_kai_mps_example_needs_its_pipe_directory_allowlisted(config):
    """KAI's MPS example mounts the host's MPS pipe directory writable: not on the (empty) default allowlist, so
    rejected until the cluster lists it (docs/policy.md, host-path)."""
    filename = "NVIDIA__KAI-Scheduler__docs__gpu-sharing__mps__gpu-sharing-with-mps.yaml"
    [(_, decision)] = decide(filename, config)
    assert decision.verdict == "rejected" and decision.validation.rule_ids == ("host-path",)
    listed = PolicyConfig(host_path_allowlist=(HostPathEntry("/tmp/nvidia-mps", writable=True),))
    [(_, decision)] = decide(filename, listed)
    assert decision.verdict == "mutated"


@pytest.mark.parametrize(
    ("filename", "rules"),
    [
        (
            "NVIDIA__gpu-operator__assets__state-device-plugin__0500_daemonset.yaml",
            {"visible-devices-env", "privileged", "host-device-path"},
        ),
        (
            "NVIDIA__gpu-operator__assets__state-driver__0500_daemonset.yaml",
            {"privileged", "host-pid", "host-device-path", "host-path"},
        ),
        ("NVIDIA__dcgm-exporter__dcgm-exporter.yaml", {"sys-admin-capability", "host-device-path"}),
        (
            "NVIDIA__k8s-device-plugin__deployments__static__gpu-feature-discovery-daemonset-with-mig-mixed.yaml",
            {"privileged", "host-device-path", "mig-control-env"},
        ),
    ],
)
def test_gpu_system_daemonsets_are_rejected_outside_exemptions(config, filename, rules):
    [(_, decision)] = decide(filename, config)
    assert decision.verdict == "rejected"
    assert set(decision.validation.rule_ids) == rules


def test_driver_daemonset_void_pins_are_respected(config):
    """NVIDIA pins void on its own non-GPU operands; those entries are accepted and never duplicated."""
    [(_, decision)] = decide("NVIDIA__gpu-operator__assets__state-driver__0500_daemonset.yaml", config)
    assert "visible-devices-env" not in decision.validation.rule_ids
    assert "k8s-driver-manager" not in decision.mutation.pinned
    assert "openshift-driver-toolkit-ctr" not in decision.mutation.pinned


def test_gpu_operator_pods_are_exempt_by_service_account_or_namespace():
    filename = "NVIDIA__gpu-operator__assets__state-device-plugin__0500_daemonset.yaml"
    by_account = PolicyConfig(exempt_service_accounts=("gpu-operator/nvidia-device-plugin",))
    [(_, decision)] = decide(filename, by_account, namespace="gpu-operator")
    assert decision.verdict == "exempt"
    [(_, elsewhere)] = decide(filename, by_account, namespace="team-a")
    assert elsewhere.verdict == "rejected"
    by_namespace = PolicyConfig(exempt_namespaces=("kube-system", "gpu-operator"))
    [(_, decision)] = decide(filename, by_namespace, namespace="gpu-operator")
    assert decision.verdict == "exempt"
