"""The webhook configurations, as rendered: what they can match, which mode each namespace gets, how they fail."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.webhook.worker import WEBHOOK_TIMEOUT_SECONDS
from tests.fakes.processes import run_captured

from .conftest import KUSTOMIZATIONS, MANIFESTS, NAMESPACE, find, kubectl, one, render
from .selectors import namespace_labels, selector_matches

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
EXPECTED_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"},
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["pods/ephemeralcontainers"],
        "scope": "Namespaced",
    },
]
#: Validation also sees plain pod UPDATEs (a CDI annotation added after creation, V9/V10); a matchCondition
#: narrows them to the ones that add or change such an annotation.
EXPECTED_VALIDATING_RULES = [
    *EXPECTED_RULES,
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"], "scope": "Namespaced"},
]


def webhooks(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(obj["kind"], hook) for obj in objects if obj["kind"] in WEBHOOK_KINDS for hook in obj["webhooks"]]


def calls_for(objects: list[dict[str, Any]], labels: dict[str, str]) -> set[str]:
    """What the API server calls for a pod created in a namespace with these labels: 'mutate' and URL paths."""
    called: set[str] = set()
    for kind, hook in webhooks(objects):
        if selector_matches(hook.get("namespaceSelector"), labels):
            called.add("mutate" if kind == "MutatingWebhookConfiguration" else hook["clientConfig"]["service"]["path"])
    return called


def test_selector_semantics_follow_the_api_server() -> None:
    selector = {"matchExpressions": [{"key": "mode", "operator": "NotIn", "values": ["off"]}]}
    assert selector_matches(selector, {})  # NotIn matches a missing label
    assert not selector_matches(selector, {"mode": "off"})
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {})
    assert selector_matches({"matchLabels": {"a": "x"}}, {"a": "x"})
    assert not selector_matches({"matchLabels": {"a": "x"}}, {"a": "y"})


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_webhooks_never_match_their_own_namespace_or_kube_system(target: str) -> None:
    objects = render(target)
    own = one(objects, "Deployment", "gpu-fence-webhook")["metadata"]["namespace"]
    hooks = webhooks(objects)
    assert len(hooks) == 3
    for namespace in ("kube-system", own, NAMESPACE):
        for mode in (None, "enforce", "warn", "off", "anything"):
            assert calls_for(objects, namespace_labels(namespace, mode)) == set(), (namespace, mode)


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_webhooks_cover_pod_create_ephemeral_container_and_for_validation_pod_update_only(target: str) -> None:
    for kind, hook in webhooks(render(target)):
        expected = EXPECTED_RULES if kind == "MutatingWebhookConfiguration" else EXPECTED_VALIDATING_RULES
        assert hook["rules"] == expected, hook["name"]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        # serve's request and response deadlines are this number: a call the API server has given up on is not
        # worth reading further (webhook/worker.py), so the manifests and the server must agree on it
        assert hook["timeoutSeconds"] == WEBHOOK_TIMEOUT_SECONDS, hook["name"]
        service = hook["clientConfig"]["service"]
        assert (service["name"], service["namespace"], service["port"]) == ("gpu-fence-webhook", NAMESPACE, 443)


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_failure_policies_fail_closed_only_where_enforcing(target: str) -> None:
    for kind, hook in webhooks(render(target)):
        path = hook["clientConfig"]["service"]["path"]
        if kind == "MutatingWebhookConfiguration":
            assert (path, hook["failurePolicy"], hook["reinvocationPolicy"]) == ("/mutate", "Ignore", "IfNeeded")
        elif path == "/validate":
            assert hook["failurePolicy"] == "Fail"
        else:
            assert (path, hook["failurePolicy"]) == ("/validate/warn", "Ignore")


MODES_ENFORCE_BY_DEFAULT = {
    None: {"mutate", "/validate"},
    "enforce": {"mutate", "/validate"},
    "warn": {"/validate/warn"},
    "off": set(),
    "typo": {"mutate", "/validate"},  # an unknown value fails safe: enforced
}
MODES_WARN_BY_DEFAULT = {
    None: {"/validate/warn"},
    "enforce": {"mutate", "/validate"},
    "warn": {"/validate/warn"},
    "off": set(),
    "typo": {"/validate/warn"},
}


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_each_namespace_gets_exactly_the_mode_its_label_asks_for(target: str) -> None:
    """Warn unless a namespace is labelled enforce: nothing breaks on install. overlays/enforce (the base with
    components/enforce) enforces every namespace not labelled warn or off."""
    expected = MODES_ENFORCE_BY_DEFAULT if target == "overlays/enforce" else MODES_WARN_BY_DEFAULT
    objects = render(target)
    for mode, calls in expected.items():
        assert calls_for(objects, namespace_labels("team-a", mode)) == calls, mode


def with_enforce_component(tmp_path: Path, overlay: str) -> list[dict[str, Any]]:
    """A site's own kustomization: an overlay plus the one line that switches to enforcing."""
    site = tmp_path / "site"
    site.mkdir()
    relative = os.path.relpath(MANIFESTS, site)
    (site / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {relative}/{overlay}\ncomponents:\n  - {relative}/components/enforce\n"
    )
    result = run_captured([kubectl(), "kustomize", str(site)], timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize("overlay", ["base", "overlays/gpu-operator", "overlays/vap", "overlays/warn-only"])
def test_the_enforce_component_is_one_line_on_top_of_any_overlay(tmp_path: Path, overlay: str) -> None:
    objects = with_enforce_component(tmp_path, overlay)
    for mode, calls in MODES_ENFORCE_BY_DEFAULT.items():
        assert calls_for(objects, namespace_labels("team-a", mode)) == calls, mode
    for binding in find(objects, "ValidatingAdmissionPolicyBinding"):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        enforced = {
            mode: selector_matches(selector, namespace_labels("team-a", mode)) for mode in MODES_ENFORCE_BY_DEFAULT
        }
        if binding["spec"]["validationActions"] == ["Deny"]:
            assert enforced == {None: True, "enforce": True, "warn": False, "off": False, "typo": True}
        else:
            assert enforced == {None: False, "enforce": False, "warn": True, "off": False, "typo": False}


def test_the_vap_bindings_follow_the_webhooks_mode_by_default() -> None:
    for binding in find(render("overlays/vap"), "ValidatingAdmissionPolicyBinding"):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        matched = {mode for mode in MODES_WARN_BY_DEFAULT if selector_matches(selector, namespace_labels("x", mode))}
        assert matched == ({"enforce"} if binding["spec"]["validationActions"] == ["Deny"] else {None, "warn", "typo"})


def test_gpu_operator_overlay_leaves_the_operator_namespace_alone() -> None:
    objects = render("overlays/gpu-operator")
    assert calls_for(objects, namespace_labels("gpu-operator")) == set()
    assert calls_for(objects, namespace_labels("gpu-operator", "enforce")) == set()
    assert calls_for(objects, namespace_labels("team-a")) == {"/validate/warn"}


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
@pytest.mark.parametrize("namespace", ["kube-public", "kube-node-lease"])
def test_kube_public_and_kube_node_lease_are_judged_like_any_other(target: str, namespace: str) -> None:
    """They hold no pods, and the webhooks see only pods: excluding them would save nothing and blind gpu-fence
    to a pod someone did create there."""
    objects = render(target)
    assert calls_for(objects, namespace_labels(namespace, "enforce")) == {"mutate", "/validate"}


def calls_webhook(
    hook: dict[str, Any],
    *,
    operation: str = "CREATE",
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    sub_resource: str = "",
) -> bool:
    """Whether the API server calls this webhook for the request, by its matchConditions (all must be true).

    The CEL variables are those the API server provides: ``object``, ``oldObject`` (null on CREATE) and
    ``request``, whose ``subResource`` is omitted when empty (``omitempty`` in admission/v1). An evaluation error
    fails the test: under failurePolicy Fail the API server would reject the request outright.
    """
    request: dict[str, Any] = {
        "operation": operation,
        "namespace": "team-a",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
    }
    env = celpy.Environment()
    for condition in hook.get("matchConditions", []):
        result = env.program(env.compile(condition["expression"])).evaluate(activation)
        assert isinstance(result, celtypes.BoolType), f"{hook['name']} {condition['name']}: {result!r}"
        if not result:
            return False
    return True


def pod_with(
    annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, scheduler: str | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "demo", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox:1.36"}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


MIRROR = {"kubernetes.io/config.mirror": "abc"}


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_match_conditions_skip_mirror_pods_and_nothing_else_on_create(target: str) -> None:
    for kind, hook in webhooks(render(target)):
        names = [c["name"] for c in hook.get("matchConditions", [])]
        if kind == "MutatingWebhookConfiguration":
            assert names == ["not-a-mirror-pod"]
        else:
            assert names == ["not-a-mirror-pod", "create-or-judged-update"]
        assert not calls_webhook(hook, obj=pod_with(MIRROR))
        assert calls_webhook(hook, obj=pod_with({"team": "a"}))
        assert calls_webhook(hook, obj=pod_with())
        assert calls_webhook(hook, obj=pod_with({"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"}))
        # kubectl debug: always judged, whatever happens to the annotations (the new container is what counts)
        debugged = pod_with({"team": "a"})
        assert calls_webhook(hook, operation="UPDATE", sub_resource="ephemeralcontainers", obj=debugged, old=debugged)
        assert not calls_webhook(
            hook, operation="UPDATE", sub_resource="ephemeralcontainers", obj=pod_with(MIRROR), old=pod_with(MIRROR)
        )


def validating_hooks(target: str) -> list[dict[str, Any]]:
    hooks = [hook for kind, hook in webhooks(render(target)) if kind == "ValidatingWebhookConfiguration"]
    assert [h["name"] for h in hooks] == ["enforce.gpu-fence.io", "warn.gpu-fence.io"]
    return hooks


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_plain_pod_updates_reach_validation_only_when_they_add_or_change_a_device_annotation(target: str) -> None:
    from gpu_fence.webhook.config import DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES
    from gpu_fence.webhook.policy import CDI_ANNOTATION_PREFIXES

    for hook in validating_hooks(target):

        def update(old: dict[str, Any], new: dict[str, Any], hook: dict[str, Any] = hook) -> bool:
            return calls_webhook(hook, operation="UPDATE", obj=new, old=old)

        # the updates every controller makes all day: labels, finalizers, unrelated annotations
        assert not update(pod_with(), pod_with(labels={"app": "a"}))
        assert not update(pod_with({"team": "a"}), pod_with({"team": "b"}))
        assert not update(pod_with(), pod_with({"example.com/cdi.k8s.io": "x", "cdi.k8s.io": "no slash"}))
        for prefix in (*CDI_ANNOTATION_PREFIXES, *DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES):
            key = prefix + ("gpu" if prefix.endswith("/") else "/pod")
            assert update(pod_with(), pod_with({key: "nvidia.com/gpu=all"})), key  # added, no annotations before
            assert update(pod_with({"team": "a"}), pod_with({"team": "a", key: "nvidia.com/gpu=all"})), key
            assert update(pod_with({key: "nvidia.com/gpu=0"}), pod_with({key: "nvidia.com/gpu=all"})), key  # changed
            kept = {key: "nvidia.com/gpu=0"}  # already there at CREATE: judged then, not again
            assert not update(pod_with(kept), pod_with({**kept, "team": "a"}, labels={"x": "y"})), key
            assert not update(pod_with({**kept, "team": "a"}), pod_with({"team": "a"})), key  # removed
        assert update(pod_with(), pod_with({"nvidia.cdi.k8s.io": "nvidia.com/gpu=all"}))  # no '/' boundary
        # a mirror pod stays skipped, even when its update adds one
        assert not update(pod_with(MIRROR), pod_with({**MIRROR, "cdi.k8s.io/gpu": "nvidia.com/gpu=all"}))


TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def tolerating(document: dict[str, Any], *tolerations: dict[str, str]) -> dict[str, Any]:
    document["spec"]["tolerations"] = [*document["spec"].get("tolerations", []), *tolerations]
    return document


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_an_update_that_adds_a_toleration_reaches_validation(target: str) -> None:
    """Tolerations are the one scheduling field a pod author can add to a created pod; with gpu_node_taints, a
    pending pod that starts to tolerate a GPU taint must meet the node rules it was spared."""
    for hook in validating_hooks(target):
        added = tolerating(pod_with(), TOLERATION)
        assert calls_webhook(hook, operation="UPDATE", obj=added, old=pod_with())
        more = tolerating(pod_with(), {"operator": "Exists"}, TOLERATION)
        assert calls_webhook(hook, operation="UPDATE", obj=more, old=tolerating(pod_with(), {"operator": "Exists"}))
        kept = tolerating(pod_with(labels={"x": "y"}), TOLERATION)
        assert not calls_webhook(hook, operation="UPDATE", obj=kept, old=tolerating(pod_with(), TOLERATION))


def test_the_webhook_denies_an_added_gpu_toleration_that_the_condition_sends() -> None:
    from gpu_fence.webhook.config import config_from_mapping
    from gpu_fence.webhook.policy import validate_update

    config = config_from_mapping({"gpu_node_taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]})
    hook = validating_hooks("base")[0]
    old = pod_with()
    old["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    new = tolerating(copy.deepcopy(old), TOLERATION)
    assert calls_webhook(hook, operation="UPDATE", obj=new, old=old)
    assert [v.rule for v in validate_update(new, old, config).violations] == ["privileged"]
    relabelled = copy.deepcopy(new)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert not calls_webhook(hook, operation="UPDATE", obj=relabelled, old=new)
    assert validate_update(relabelled, new, config).violations == ()


KAI = "kai-scheduler"
KAI_CREATED = {"gpu-fraction": "0.5", "runai/shared-gpu-configmap": "main-bcdfghj-shared-gpu"}


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_plain_pod_updates_of_kai_s_bind_time_annotations_reach_validation(target: str) -> None:
    """KAI's binder reads them when it binds: adding, removing or changing one is sent; KAI's own updates are not."""
    from gpu_fence.kai import BIND_TIME_ANNOTATIONS

    for hook in validating_hooks(target):

        def update(old: dict[str, str], new: dict[str, str], hook: dict[str, Any] = hook) -> bool:
            return calls_webhook(hook, operation="UPDATE", obj=pod_with(new, scheduler=KAI), old=pod_with(old))

        for key in BIND_TIME_ANNOTATIONS:
            assert update(KAI_CREATED, {**KAI_CREATED, key: "changed"}), key  # added or changed
            assert update({**KAI_CREATED, key: "x"}, {k: v for k, v in KAI_CREATED.items() if k != key}), key
        assert update(KAI_CREATED, {})  # all removed
        assert update({}, KAI_CREATED)  # added to a pod that had no annotations
        assert not update(KAI_CREATED, KAI_CREATED)
        # the binder's and the pod grouper's own patches
        assert not update(KAI_CREATED, {**KAI_CREATED, "received-resource-type": "Fraction", "pod-group-name": "pg"})


ANNOTATION_KEYS = st.sampled_from(
    [
        "cdi.k8s.io/gpu",
        "cdi.k8s.io/other",
        "nvidia.cdi.k8s.io",
        "nvidia.cdi.k8s.io/pod",
        "nvidia.cdi.k8s.io.x",
        "team",
        "example.com/cdi.k8s.io",
        "cdi.k8s.io",
        "devices.crio.io",
        "io.kubernetes.cri-o.Devices",
        "mounts.noderesource.dev/pod",
        "devices.nri.io/container.app",
        "devices.crio",
        "gpu-fraction",
        "gpu-memory",
        "gpu-fraction-container-name",
        "runai/shared-gpu-configmap",
        "received-resource-type",
    ]
)
ANNOTATIONS = st.none() | st.dictionaries(ANNOTATION_KEYS, st.sampled_from(["", "nvidia.com/gpu=0", "all"]), max_size=4)


@settings(max_examples=80, deadline=None)
@given(old=ANNOTATIONS, new=ANNOTATIONS, scheduler=st.sampled_from([KAI, "default-scheduler"]))
def test_the_update_condition_skips_only_updates_the_webhook_would_allow(old, new, scheduler) -> None:
    """The condition is the webhook's own update rule in CEL: on a pod KAI schedules, called iff validate_update
    reports something; on another scheduler's pod, KAI's annotations are sent too (the condition reads no scheduler
    name, so a site's own KAI scheduler names need no second list) and allowed there."""
    from gpu_fence.kai import BIND_TIME_ANNOTATIONS
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy import validate_update

    hook = validating_hooks("base")[0]
    old_pod, new_pod = pod_with(old, scheduler=scheduler), pod_with(new, scheduler=scheduler)
    denied = bool(validate_update(new_pod, old_pod, load_config(None)).violations)
    called = calls_webhook(hook, operation="UPDATE", obj=new_pod, old=old_pod)
    kai_touched = any((old or {}).get(key) != (new or {}).get(key) for key in BIND_TIME_ANNOTATIONS)
    assert called == denied or (scheduler != KAI and called and kai_touched and not denied)


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_webhook_service_routes_to_the_webhook_pods(target: str) -> None:
    objects = render(target)
    service = one(objects, "Service", "gpu-fence-webhook")
    deployment = one(objects, "Deployment", "gpu-fence-webhook")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    assert find(objects, "MutatingWebhookConfiguration")[0]["webhooks"][0]["clientConfig"]["service"]["port"] == 443
