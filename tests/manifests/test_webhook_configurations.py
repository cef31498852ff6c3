"""The webhook configurations, as rendered: what they can match, which mode each namespace gets, how they fail."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from .conftest import KUSTOMIZATIONS, NAMESPACE, find, one, render
from .selectors import namespace_labels, selector_matches

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
EXPECTED_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
     "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/ephemeralcontainers"],
     "scope": "Namespaced"},
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
def test_every_webhook_covers_pod_create_and_ephemeral_container_update_only(target: str) -> None:
    for _, hook in webhooks(render(target)):
        assert hook["rules"] == EXPECTED_RULES, hook["name"]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert 1 <= hook["timeoutSeconds"] <= 5, "a short timeout bounds the latency added to pod creation"
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
    expected = MODES_WARN_BY_DEFAULT if target == "overlays/warn-only" else MODES_ENFORCE_BY_DEFAULT
    objects = render(target)
    for mode, calls in expected.items():
        assert calls_for(objects, namespace_labels("team-a", mode)) == calls, mode


def test_gpu_operator_overlay_leaves_the_operator_namespace_alone() -> None:
    objects = render("overlays/gpu-operator")
    assert calls_for(objects, namespace_labels("gpu-operator")) == set()
    assert calls_for(objects, namespace_labels("team-a")) == {"mutate", "/validate"}


def _mirror_condition_allows(expression: str, pod: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"object": celpy.json_to_cel(pod)}))


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_match_conditions_skip_mirror_pods_and_nothing_else(target: str) -> None:
    mirror = {"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}, "spec": {}}
    annotated = {"metadata": {"annotations": {"team": "a"}}, "spec": {}}
    bare = {"metadata": {}, "spec": {}}
    for _, hook in webhooks(render(target)):
        conditions = hook.get("matchConditions", [])
        assert [c["name"] for c in conditions] == ["not-a-mirror-pod"]
        expression = conditions[0]["expression"]
        assert not _mirror_condition_allows(expression, mirror)
        assert _mirror_condition_allows(expression, annotated)
        assert _mirror_condition_allows(expression, bare)


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
