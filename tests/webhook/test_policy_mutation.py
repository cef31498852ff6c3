"""mutate, exemption and evaluate: every patch is applied with the reference jsonpatch and the result is checked
against the Kubernetes Pod schema, then mutated again to prove there is nothing left to do."""

from __future__ import annotations

import copy

import pytest

from gpu_fence.webhook import policy
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.policy import Decision, Mutation, evaluate, exemption, mutate, validate
from tests.fakes.pods import (
    NVD,
    all_containers,
    apply_patch,
    assert_valid_pod,
    container,
    env,
    env_of,
    gpu_container,
    kai_fraction_pod,
    pod,
)


def pinned_pod(document, config):
    """Mutate, apply with jsonpatch, check schema and idempotence; return the patched pod and the mutation."""
    before = copy.deepcopy(document)
    mutation = mutate(document, config)
    assert document == before, "mutate must not modify its input"
    patched = apply_patch(document, mutation.patch)
    assert_valid_pod(patched)
    assert mutate(patched, config) == Mutation((), ())
    return patched, mutation


def test_env_absent_adds_the_whole_array(config):
    patched, mutation = pinned_pod(pod(container("web")), config)
    assert mutation.patch == (
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": NVD, "value": "void"}]},
    )
    assert mutation.pinned == ("web",)
    assert patched["spec"]["containers"][0]["env"] == [{"name": NVD, "value": "void"}]


def test_env_present_appends(config):
    document = pod(container("web", environment=[env("PORT", "8080")]))
    patched, mutation = pinned_pod(document, config)
    assert mutation.patch == (
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": NVD, "value": "void"}},
    )
    assert patched["spec"]["containers"][0]["env"] == [env("PORT", "8080"), env(NVD, "void")]


def test_empty_and_null_env(config):
    empty = pod(container("a", environment=[]))
    assert mutate(empty, config).patch[0]["path"] == "/spec/containers/0/env/-"
    pinned_pod(empty, config)
    null = pod(container("a", env=None))
    assert mutate(null, config).patch[0]["path"] == "/spec/containers/0/env"
    pinned_pod(null, config)


def test_every_kind_of_container_is_pinned_and_gpu_ones_are_not(config):
    document = pod(
        gpu_container("cuda"),
        container("sidecar"),
        init=[container("setup"), container("proxy", restartPolicy="Always")],
        ephemeral=[container("debug")],
    )
    patched, mutation = pinned_pod(document, config)
    assert set(mutation.pinned) == {"sidecar", "setup", "proxy", "debug"}
    assert {op["path"] for op in mutation.patch} == {
        "/spec/containers/1/env",
        "/spec/initContainers/0/env",
        "/spec/initContainers/1/env",
        "/spec/ephemeralContainers/0/env",
    }
    assert "env" not in patched["spec"]["containers"][0]
    assert validate(patched, config).violations == ()


def test_existing_entries_are_never_touched_or_duplicated(config):
    for value in ("void", "none", "all", "0"):
        document = pod(container("c", environment=[env(NVD, value), env("X", "1")]))
        assert mutate(document, config) == Mutation((), ())
    value_from = pod(container("c", environment=[env(NVD, configMapKeyRef={"name": "m", "key": "k"})]))
    assert mutate(value_from, config).patch == ()


def test_env_from_is_overridden_by_the_explicit_pin(config):
    document = pod(container("c", envFrom=[{"configMapRef": {"name": "cuda-settings"}}]))
    patched, mutation = pinned_pod(document, config)
    assert mutation.pinned == ("c",) and env_of(patched["spec"]["containers"][0]) == {NVD: "void"}


def test_nothing_to_do_gives_no_patch(config):
    assert mutate(pod(gpu_container()), config) == Mutation((), ())
    assert mutate(pod(container(environment=[env(NVD, "void")])), config) == Mutation((), ())


def test_unreadable_env_is_left_for_validation(config):
    document = pod(container("odd", env="NVIDIA_VISIBLE_DEVICES=void"), container("ok"))
    mutation = mutate(document, config)
    assert mutation.pinned == ("ok",)
    patched = apply_patch(document, mutation.patch)
    assert [v.rule for v in validate(patched, config).violations] == ["unpinned-container"]


def test_kai_fraction_pods_are_pinned_whole(config):
    """The fraction container too: KAI's webhook replaces its pin with KAI's reference (AddEnvVarToContainer drops
    every entry of the name before appending its own)."""
    document = kai_fraction_pod(container("gpu-workload"), container("sidecar"))
    _, mutation = pinned_pod(document, config)
    assert mutation.pinned == ("gpu-workload", "sidecar")


def test_dra_claim_containers_are_pinned(config):
    document = pod(
        container("ctr", resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
    )
    patched, mutation = pinned_pod(document, config)
    assert mutation.pinned == ("ctr",)
    assert env_of(patched["spec"]["containers"][0]) == {NVD: "void"}


def test_aliases_are_pinned_after_the_variable_and_only_where_missing():
    aliased = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU", "GPU_ALIAS"))
    document = pod(
        container("bare"),
        container("some", environment=[env("PORT", "1"), env("GPU_ALIAS", "void")]),
        container("all", environment=[env(NVD, "none"), env("DOCKER_RESOURCE_GPU", "void"), env("GPU_ALIAS", "")]),
    )
    patched, mutation = pinned_pod(document, aliased)
    assert mutation.pinned == ("bare", "some")
    assert mutation.patch == (
        {
            "op": "add",
            "path": "/spec/containers/0/env",
            "value": [env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "void"), env("GPU_ALIAS", "void")],
        },
        {"op": "add", "path": "/spec/containers/1/env/-", "value": env(NVD, "void")},
        {"op": "add", "path": "/spec/containers/1/env/-", "value": env("DOCKER_RESOURCE_GPU", "void")},
    )
    assert validate(patched, aliased).violations == ()


def test_only_pins_the_named_ephemeral_containers(config):
    document = pod(container("main"), ephemeral=[container("old-debug"), container("debugger")])
    mutation = mutate(document, config, only={"debugger"})
    assert mutation.patch == (
        {"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [{"name": NVD, "value": "void"}]},
    )
    assert mutation.pinned == ("debugger",)
    assert mutate(document, config, only=()) == Mutation((), ())


def test_patch_values_are_fresh_objects(config):
    first = mutate(pod(container("a")), config)
    first.patch[0]["value"].append("mangled")
    second = mutate(pod(container("a")), config)
    assert second.patch[0]["value"] == [{"name": NVD, "value": "void"}]


@pytest.mark.parametrize(
    "segment, escaped",
    [
        ("a/b", "a~1b"),
        ("a~b", "a~0b"),
        ("~1", "~01"),
        ("/~", "~1~0"),
        ("nvidia.com/gpu.present", "nvidia.com~1gpu.present"),
    ],
)
def test_own_apply_patch_unescapes_pointers_as_rfc_6901_and_jsonpatch_do(segment, escaped):
    """``~1`` is "/" and ``~0`` is "~", unescaped in that order, so ``~01`` is the key ``~1``."""
    operations = [{"op": "add", "path": f"/metadata/annotations/{escaped}", "value": "x"}]
    document = {"metadata": {"annotations": {}}}
    patched = apply_patch(document, operations)
    assert patched["metadata"]["annotations"] == {segment: "x"}
    assert policy.apply_patch(document, operations) == patched


def test_own_apply_patch_agrees_with_jsonpatch_and_copies_on_write(config):
    """Object identity is the point of the last assertion: sharing the subtrees a patch does not touch is
    apply_patch's stated contract (a deep copy per pod would dominate the policy's cost)."""
    document = pod(
        gpu_container("cuda"), container("a"), container("b", environment=[env("X", "1")]), init=[container("i")]
    )
    before = copy.deepcopy(document)
    mutation = mutate(document, config)
    ours = policy.apply_patch(document, mutation.patch)
    assert ours == apply_patch(document, mutation.patch)
    assert document == before
    assert ours["spec"]["containers"][0] is document["spec"]["containers"][0]  # untouched subtrees are shared
    with pytest.raises(ValueError, match="only 'add'"):
        policy.apply_patch(document, [{"op": "remove", "path": "/spec"}])


# --- exemption ----------------------------------------------------------------------------------------------------


def test_exempt_namespaces(config):
    assert exemption(pod(), config, namespace="kube-system") == "namespace kube-system is exempt"
    assert exemption(pod(), config, namespace="default") is None


def test_exempt_service_accounts():
    custom = PolicyConfig(exempt_service_accounts=("gpu-operator/nvidia-device-plugin", "tools/default"))
    plugin = pod(serviceAccountName="nvidia-device-plugin")
    reason = exemption(plugin, custom, namespace="gpu-operator")
    assert reason == "service account gpu-operator/nvidia-device-plugin is exempt"
    assert exemption(plugin, custom, namespace="default") is None
    assert exemption(pod(), custom, namespace="tools") == "service account tools/default is exempt"
    assert exemption(pod(serviceAccount="nvidia-device-plugin"), custom, namespace="gpu-operator") is not None


def test_mirror_pods_are_exempt(config):
    mirror = pod(annotations={"kubernetes.io/config.mirror": "abc123"})
    assert "mirror pod" in exemption(mirror, config, namespace="default")


def test_pod_controlled_labels_and_annotations_do_not_exempt(config):
    document = pod(annotations={"gpu-fence.io/exempt": "true", "gpu-fence.io/mode": "off"})
    document["metadata"]["labels"] = {"gpu-fence.io/mode": "off", "gpu-fence.io/exempt": "true"}
    assert exemption(document, config, namespace="default") is None
    assert evaluate(document, config, namespace="default").verdict == "mutated"


@pytest.mark.parametrize("garbage", [None, [], "x", {"metadata": []}, {"spec": {"serviceAccountName": ["a"]}}])
def test_exemption_of_garbage(config, garbage):
    assert exemption(garbage, config, namespace="default") is None
    assert exemption(garbage, config, namespace=["kube-system"]) is None  # type: ignore[arg-type]


# --- evaluate -----------------------------------------------------------------------------------------------------


def test_verdicts(config):
    assert evaluate(pod(gpu_container()), config, namespace="default").verdict == "allowed"
    mutated = evaluate(pod(container("a")), config, namespace="default")
    assert mutated.verdict == "mutated" and mutated.mutation.pinned == ("a",) and mutated.validation.violations == ()
    rejected = evaluate(pod(container("a", environment=[env(NVD, "all")])), config, namespace="default")
    assert rejected.verdict == "rejected" and rejected.mutation.patch == ()
    exempt = evaluate(pod(container("a", environment=[env(NVD, "all")])), config, namespace="kube-system")
    assert exempt == Decision("namespace kube-system is exempt", Mutation((), ()), exempt.validation)
    assert exempt.verdict == "exempt" and exempt.validation.violations == ()


def test_evaluate_judges_the_mutated_pod(config):
    """Mutation fixes what it can; validation still rejects what mutation must not fix."""
    document = pod(container("plain"), container("priv", securityContext={"privileged": True}))
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "rejected"
    assert decision.mutation.pinned == ("plain", "priv")
    assert [(v.rule, v.container) for v in decision.validation.violations] == [("privileged", "priv")]


def test_evaluate_does_not_modify_its_input(config):
    document = pod(container("a"), init=[container("b", environment=[])])
    before = copy.deepcopy(document)
    evaluate(document, config, namespace="default")
    assert document == before


def test_pinned_pod_is_valid_for_every_container_field(config):
    document = pod(
        container("a"), container("b", environment=[env("A", "1")]), init=[container("c")], ephemeral=[container("d")]
    )
    patched, _ = pinned_pod(document, config)
    assert all(env_of(c)[NVD] == "void" for c in all_containers(patched))
