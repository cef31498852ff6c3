"""Properties of the policy over generated pods (hypothesis): the patch always applies and yields a valid Pod,
mutation is idempotent, a mutated pod is never unpinned, and no input whatsoever makes the policy raise."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_fence.verdicts import Verdict
from gpu_fence.webhook import policy
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.policy import (
    NVIDIA_RUNTIME_CLASS,
    RULES,
    Decision,
    Mutation,
    Validation,
    Violation,
    evaluate,
    mutate,
    validate,
)
from tests.fakes.pods import apply_patch, assert_valid_pod, json_values, mangled_pods, pods

CONFIG = PolicyConfig()
ALIASED = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",), exempt_service_accounts=("ns/default",))
RULE_IDS = {rule.id for rule in RULES}
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(pods())
def test_patch_applies_and_gives_a_valid_pod(document):
    assert_valid_pod(document)  # the generator itself must produce what the API server would accept
    mutation = mutate(document, CONFIG)
    patched = apply_patch(document, mutation.patch)
    assert_valid_pod(patched)
    assert policy.apply_patch(document, mutation.patch) == patched
    assert len(mutation.pinned) == len(mutation.patch)


@PROPERTY
@given(pods())
def test_mutation_is_idempotent_and_leaves_no_unpinned_container(document):
    before = copy.deepcopy(document)
    patched = apply_patch(document, mutate(document, CONFIG).patch)
    assert document == before
    assert mutate(patched, CONFIG) == Mutation((), ())
    assert "unpinned-container" not in {v.rule for v in validate(patched, CONFIG).violations}


@PROPERTY
@given(pods())
def test_mutation_only_adds_the_pin(document):
    """Nothing but a NVIDIA_VISIBLE_DEVICES=void entry is added; every existing entry stays where it was."""
    patched = apply_patch(document, mutate(document, CONFIG).patch)
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for old, new in zip(document["spec"].get(field, []), patched["spec"].get(field, []), strict=True):
            old_env, new_env = old.get("env") or [], new.get("env") or []
            assert new_env[: len(old_env)] == old_env
            assert new_env[len(old_env) :] in ([], [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])
            assert {k: v for k, v in new.items() if k != "env"} == {k: v for k, v in old.items() if k != "env"}
    assert {k: v for k, v in patched.items() if k != "spec"} == {k: v for k, v in document.items() if k != "spec"}


@PROPERTY
@given(pods())
def test_evaluate_is_mutate_then_validate(document):
    decision = evaluate(document, CONFIG, namespace="default")
    patched = apply_patch(document, decision.mutation.patch)
    assert decision.mutation == mutate(document, CONFIG)
    assert decision.validation == validate(patched, CONFIG)
    assert decision.verdict == (
        "rejected" if decision.validation.violations else "mutated" if decision.mutation.patch else "allowed"
    )


@PROPERTY
@given(pods(), st.data())
def test_only_touches_the_named_ephemeral_containers(document, data):
    ephemeral = [c["name"] for c in document["spec"].get("ephemeralContainers", [])]
    chosen = set(data.draw(st.lists(st.sampled_from(ephemeral), unique=True))) if ephemeral else set()
    mutation = mutate(document, CONFIG, only=chosen)
    assert set(mutation.pinned) <= chosen
    assert all(op["path"].startswith("/spec/ephemeralContainers/") for op in mutation.patch)
    assert {v.container for v in validate(document, CONFIG, only=chosen).violations} <= chosen | {None}


def check_shapes(decision: Decision) -> None:
    assert isinstance(decision.mutation, Mutation) and isinstance(decision.validation, Validation)
    for violation in decision.validation.violations:
        assert isinstance(violation, Violation) and violation.rule in RULE_IDS
        assert violation.message.startswith(violation.rule + ": ")
        assert violation.container is None or isinstance(violation.container, str)
    for warning in decision.validation.warnings:  # typed, each with its rule id; the envelope splits long ones
        assert isinstance(warning, Violation) and warning.message.startswith(warning.rule + ": ")
        assert warning.rule in (*RULE_IDS, NVIDIA_RUNTIME_CLASS)
    assert isinstance(decision.verdict, Verdict)


@PROPERTY
@given(mangled_pods(), st.sampled_from([CONFIG, ALIASED]), st.sampled_from(["default", "ns", "kube-system"]))
def test_no_input_makes_the_policy_raise(document, config, namespace):
    before = copy.deepcopy(document)
    mutation = mutate(document, config)
    validation = validate(document, config)
    decision = evaluate(document, config, namespace=namespace)
    mutate(document, config, only={"a", "b"})
    validate(document, config, only=["a"])
    check_shapes(decision)
    check_shapes(Decision(None, mutation, validation))
    assert repr(document) == repr(before)  # repr, not ==: a generated NaN is unequal to itself
    if mutation.patch:  # whatever mutate emits for a pod it can read must apply
        apply_patch(document, mutation.patch)


@PROPERTY
@given(json_values)
def test_bare_garbage_is_rejected_not_raised(document):
    decision = evaluate(document, CONFIG, namespace="default")
    check_shapes(decision)
    if not isinstance(document, dict):
        assert decision.verdict == "rejected"
