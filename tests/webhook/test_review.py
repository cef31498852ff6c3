"""The AdmissionReview envelope (webhook.review), tested over real and derived AdmissionReview fixtures.

The policy is replaced by a small stand-in here, on purpose: these tests pin the *envelope* contract (uid echo,
patch/patchType pairing, status codes, warnings, audit annotations, ephemeral-container scoping, fail closed),
independent of what the policy decides. The real policy is exercised end to end in tests/e2e.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import get_args, get_type_hints

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.verdicts import ReviewVerdict
from gpu_fence.warning_text import CONTINUATION, MAX_WARNING_CHARS
from gpu_fence.webhook import policy as real_policy
from gpu_fence.webhook import review as review_module
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.reasons import BadRequestReason
from gpu_fence.webhook.review import (
    AdmissionRequest,
    AdmissionResponse,
    AdmissionReview,
    AdmissionReviewResponse,
    BadReview,
    Endpoint,
    GroupVersionKind,
    Operation,
    ResponseStatus,
    new_container_names,
    parse,
    review,
)
from tests.fakes.pods import mangled_pods, pods
from tests.fakes.stand_in_policy import StandInPolicy, Validation, Violation
from tests.fakes.stand_in_policy import advice as stand_in_advice

FIXTURES = Path(__file__).parent / "admissionreviews"


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def gpu_mix() -> dict:
    """A ReplicaSet's pod create review: a GPU trainer beside a log shipper and an init container that get none."""
    return load("pod-create-replicaset-gpu-mix")


def mutated(body: dict, policy: StandInPolicy | None = None) -> dict:
    """The pod after applying what /mutate returned."""
    outcome = review(body, Endpoint.MUTATE, None, policy or StandInPolicy())
    pod = body["request"]["object"]
    patch = outcome.response["response"].get("patch")
    if patch is None:
        return pod
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(patch)))


# -- the response envelope ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize(
    "name",
    [
        "pod-create-kubectl",
        "pod-create-minimal",
        "pod-create-replicaset-gpu-mix",
        "pod-create-dryrun",
        "pod-create-mirror",
        "pod-update-ephemeralcontainers",
        "pod-delete",
        "deployment-create",
    ],
)
def test_every_response_echoes_version_kind_and_uid(name, endpoint):
    body = load(name)
    document = review(body, endpoint, None, StandInPolicy()).response
    assert document["apiVersion"] == "admission.k8s.io/v1"
    assert document["kind"] == "AdmissionReview"
    assert document["response"]["uid"] == body["request"]["uid"]
    response = document["response"]
    # patch and patchType come together, only from /mutate
    assert ("patch" in response) == ("patchType" in response)
    if endpoint is not Endpoint.MUTATE:
        assert "patch" not in response
    if not response["allowed"]:
        assert response["status"]["code"] >= 400
    for warning in response.get("warnings", []):
        assert len(warning) <= MAX_WARNING_CHARS
    for key in response.get("auditAnnotations", {}):
        # the API server prefixes "<webhook name>/": the key must be a valid qualified-name part
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", key), key


def keys(typed: type) -> frozenset[str]:
    return typed.__required_keys__ | typed.__optional_keys__


V1_FIXTURES = sorted(path.stem for path in FIXTURES.glob("*.json") if path.stem != "pod-create-v1beta1")


@pytest.mark.parametrize("name", V1_FIXTURES)
def test_the_request_type_describes_what_api_servers_send(name):
    """The fixtures are requests real API servers sent (SOURCES.tsv): every key they use is one the type names."""
    body = load(name)
    assert set(body) == keys(AdmissionReview)
    request = body["request"]
    assert AdmissionRequest.__required_keys__ <= set(request) <= keys(AdmissionRequest)
    assert request["operation"] in get_args(Operation)
    assert set(request["kind"]) == keys(GroupVersionKind)


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize(
    "policy",
    [StandInPolicy(), StandInPolicy(warnings=("advice",)), StandInPolicy(fail=ValueError("bug"))],
    ids=["plain", "warnings", "failing"],
)
@pytest.mark.parametrize("name", V1_FIXTURES)
def test_every_answer_has_the_shape_its_type_names(name, policy, endpoint):
    document = review(load(name), endpoint, PolicyConfig(), policy).response
    assert set(document) == keys(AdmissionReviewResponse)
    response = document["response"]
    assert AdmissionResponse.__required_keys__ <= set(response) <= keys(AdmissionResponse)
    if "status" in response:
        assert set(response["status"]) == keys(ResponseStatus)
    assert response.get("patchType", "JSONPatch") in get_args(get_type_hints(AdmissionResponse)["patchType"])


def test_mutate_pins_non_gpu_containers_with_a_patch_that_applies(gpu_mix):
    outcome = review(gpu_mix, Endpoint.MUTATE, None, StandInPolicy())
    response = outcome.response["response"]
    assert outcome.verdict is ReviewVerdict.PATCHED
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert response["auditAnnotations"] == {"pinned": "fetch-weights,log-shipper"}
    pod = mutated(gpu_mix)
    env = {c["name"]: c.get("env") for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
    assert env["trainer"] is None
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in env["log-shipper"]
    assert env["fetch-weights"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_mutate_returns_no_patch_when_nothing_changes(gpu_mix):
    gpu_mix["request"]["object"] = mutated(gpu_mix)
    outcome = review(gpu_mix, Endpoint.MUTATE, None, StandInPolicy())
    assert outcome.verdict is ReviewVerdict.ALLOWED
    assert outcome.response["response"] == {"uid": gpu_mix["request"]["uid"], "allowed": True}


def test_validate_denies_with_403_naming_rule_container_and_fix(gpu_mix):
    outcome = review(gpu_mix, Endpoint.VALIDATE, None, StandInPolicy())
    response = outcome.response["response"]
    assert outcome.verdict is ReviewVerdict.DENIED
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    message = response["status"]["message"]
    assert "unpinned-container: container 'log-shipper'" in message and "'fetch-weights'" in message
    assert "set NVIDIA_VISIBLE_DEVICES=void" in message
    assert outcome.rules == ("unpinned-container",)
    assert response["auditAnnotations"] == {"rules": "unpinned-container"}


def test_validate_allows_the_mutated_pod(gpu_mix):
    gpu_mix["request"]["object"] = mutated(gpu_mix)
    outcome = review(gpu_mix, Endpoint.VALIDATE, None, StandInPolicy())
    assert outcome.verdict is ReviewVerdict.ALLOWED
    assert outcome.response["response"]["allowed"] is True


def test_warn_mode_judges_the_pod_as_pinned_and_splits_long_warnings(gpu_mix):
    """No mutating webhook runs in a warn namespace: the pod is judged as it would leave it, so the containers it
    would pin are named once, not as one unpinned-container each; a warning too long for one line goes on in the
    next, nothing cut."""
    containers = gpu_mix["request"]["object"]["spec"]["containers"]
    containers[1]["securityContext"] = {"privileged": True}
    long_name = "log-shipper-with-a-very-long-name-" + "x" * 120
    containers[1]["name"] = long_name
    policy = StandInPolicy(warnings=("envFrom cannot be seen into",))
    outcome = review(gpu_mix, Endpoint.VALIDATE_WARN, None, policy)
    response = outcome.response["response"]
    assert outcome.verdict is ReviewVerdict.WARNED
    assert response["allowed"] is True and "status" not in response and "patch" not in response
    assert outcome.rules == ("privileged",)
    warnings = response["warnings"]
    assert all(len(w) <= MAX_WARNING_CHARS for w in warnings) and not any("…" in w for w in warnings)
    first = warnings.index(next(w for w in warnings if w.startswith("privileged: container")))
    would_pin = next(
        i for i, w in enumerate(warnings) if w.startswith("gpu-fence: enforce mode would pin 2 containers")
    )
    said = " ".join(w.strip() for w in warnings[first:would_pin])
    assert long_name in said.replace(" ", "") and all(w.startswith("  ") for w in warnings[first + 1 : would_pin])
    assert warnings[-1] == "envFrom cannot be seen into" and not any("unpinned" in w for w in warnings)
    assert policy.calls[-2:] == [("apply_patch", 2), ("validate", None)]  # the pins, applied before validation


def test_warn_mode_says_nothing_of_pins_when_nothing_would_be_pinned(gpu_mix):
    gpu_mix["request"]["object"] = mutated(gpu_mix)
    outcome = review(gpu_mix, Endpoint.VALIDATE_WARN, None, StandInPolicy())
    assert outcome.verdict is ReviewVerdict.ALLOWED and "warnings" not in outcome.response["response"]


def test_a_way_out_shared_by_violations_is_said_once():
    shared = 'node-exporter reads the node by design: add "monitoring/ne" to exempt_service_accounts'

    class NodeAgent(StandInPolicy):
        def validate(self, pod, config, *, only=None, namespace=None):
            found = tuple(Violation("host-path", "", f"host-path: volume v{i}", shared) for i in range(3))
            return Validation(found)

    denied = review(crowded(1), Endpoint.VALIDATE, None, NodeAgent()).response["response"]["status"]["message"]
    assert denied.count(shared) == 1 and denied.endswith(f". Way out: {shared}")
    assert denied.startswith("gpu-fence: 3 violation(s): host-path: volume v0; host-path: volume v1")
    warned = review(crowded(1), Endpoint.VALIDATE_WARN, None, NodeAgent()).response["response"]["warnings"]
    assert sum("exempt_service_accounts" in w for w in warned) == 1
    assert any(w.startswith("gpu-fence: way out: node-exporter") for w in warned)


def test_policy_warnings_come_back_on_allowed_validations():
    body = load("pod-create-kubectl")
    body["request"]["object"] = mutated(body)
    outcome = review(body, Endpoint.VALIDATE, None, StandInPolicy(warnings=("runtimeClassName nvidia on a CPU pod",)))
    assert outcome.response["response"]["allowed"] is True
    assert outcome.response["response"]["warnings"] == ["runtimeClassName nvidia on a CPU pod"]


# -- the warning budget and the length of a denial ---------------------------------------------------------------

#: The API server keeps at most 4096 characters of warnings per request, from all webhooks and policies together,
#: and drops what comes after (k8s.io/apiserver/pkg/endpoints/filters/warning.go, truncateAtTotalRunes).
API_SERVER_WARNING_CHARS = 4096


def crowded(containers: int, *, privileged: bool = False) -> dict:
    """A Pod CREATE with many unpinned containers: one violation each (two when privileged)."""
    body = load("pod-create-minimal")
    spec = body["request"]["object"]["spec"]
    spec["containers"] = [
        {
            "name": f"worker-{index:03d}",
            "image": "busybox:1.36",
            **({"securityContext": {"privileged": True}} if privileged else {}),
        }
        for index in range(containers)
    ]
    return body


def _more(summary: str) -> int:
    found = re.search(r"and (\d+) more violations?", summary)
    assert found, summary
    return int(found.group(1))


def test_warn_mode_keeps_warnings_within_budget_and_counts_the_rest():
    outcome = review(crowded(80, privileged=True), Endpoint.VALIDATE_WARN, None, StandInPolicy())
    warnings = outcome.response["response"]["warnings"]
    assert outcome.verdict is ReviewVerdict.WARNED and outcome.response["response"]["allowed"] is True
    assert sum(len(w) for w in warnings) <= review_module.WARNING_BUDGET_CHARS < API_SERVER_WARNING_CHARS
    assert all(len(w) <= MAX_WARNING_CHARS for w in warnings)
    *shown, summary = warnings
    # the first violations, in order, then one line that says how many were left out and where to find them
    assert shown == [
        f"privileged: container 'worker-{i:03d}': privileged containers see every GPU; remove "
        "securityContext.privileged"
        for i in range(len(shown))
    ]
    assert summary.startswith("gpu-fence: ") and "audit annotation" in summary and "check" in summary
    assert len(shown) + _more(summary) == 80 and "1 more warning " in summary  # what it would pin, after them
    # every rule stays in the audit annotation, whatever was cut
    assert outcome.response["response"]["auditAnnotations"] == {"rules": "privileged"}


def test_policy_warnings_after_a_full_budget_are_counted_not_lost_silently():
    advice = tuple(f"container 'worker-{i:03d}' requests a GPU and uses envFrom" for i in range(5))
    outcome = review(crowded(80, privileged=True), Endpoint.VALIDATE_WARN, None, StandInPolicy(warnings=advice))
    *_, summary = outcome.response["response"]["warnings"]
    assert "6 more warnings" in summary and len(summary) <= MAX_WARNING_CHARS  # with what it would pin


def test_a_denial_keeps_its_advisory_warnings_within_budget():
    advice = tuple(f"advice {i:03d}: " + "x" * 100 for i in range(60))
    outcome = review(crowded(3), Endpoint.VALIDATE, None, StandInPolicy(warnings=advice))
    warnings = outcome.response["response"]["warnings"]
    assert outcome.verdict is ReviewVerdict.DENIED
    assert sum(len(w) for w in warnings) <= review_module.WARNING_BUDGET_CHARS
    assert warnings[0].startswith("advice 000") and "more warnings" in warnings[-1]


def test_few_warnings_come_back_whole_without_a_summary():
    outcome = review(
        crowded(3, privileged=True), Endpoint.VALIDATE_WARN, None, StandInPolicy(warnings=("envFrom advice",))
    )
    warnings = outcome.response["response"]["warnings"]
    assert len(warnings) == 5 and warnings[-1] == "envFrom advice" and "would pin 3 containers" in warnings[-2]
    assert not any("more violation" in w for w in warnings)


def test_a_denial_lists_the_first_violations_then_counts_the_rest():
    outcome = review(crowded(80, privileged=True), Endpoint.VALIDATE, None, StandInPolicy())
    message = outcome.response["response"]["status"]["message"]
    assert outcome.verdict is ReviewVerdict.DENIED and outcome.rules == ("privileged", "unpinned-container")
    assert len(message) <= review_module.MAX_DENY_MESSAGE_CHARS
    assert message.startswith("gpu-fence: 160 violation(s): privileged: container 'worker-000'")
    listed = message.count("container 'worker-")
    assert listed >= 2 and listed + _more(message) == 160
    # the rules of what was left out are named, so nobody has to guess what else is wrong
    assert message.rstrip(")").endswith("privileged, unpinned-container")


def test_one_huge_violation_is_cut_not_dropped():
    huge = Violation(
        "host-device-path",
        "",
        "host-device-path: volume 'v' mounts host path '/"
        + "d/" * 3000
        + "', which exposes /dev; remove the hostPath volume",
    )

    class OneHuge(StandInPolicy):
        def validate(self, pod, config, *, only=None, namespace=None):
            return Validation((huge,))

    denied = review(crowded(1), Endpoint.VALIDATE, None, OneHuge()).response["response"]["status"]["message"]
    assert len(denied) <= review_module.MAX_DENY_MESSAGE_CHARS
    assert denied.startswith("gpu-fence: 1 violation(s): host-device-path: volume 'v'") and "more" not in denied
    warned = review(crowded(1), Endpoint.VALIDATE_WARN, None, OneHuge()).response["response"]["warnings"]
    *lines, would_pin = warned  # the violation in at most four lines, cut in the last; then what it would pin
    assert len(lines) == review_module.MAX_WARNING_LINES and lines[-1].endswith("…")
    assert lines[0].startswith("host-device-path: volume 'v'") and "would pin" in would_pin


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=400), max_size=120),
    advice=st.lists(st.text(min_size=1, max_size=200), max_size=30),
)
def test_any_number_and_size_of_violations_fits_and_is_accounted_for(lengths, advice):
    violations = tuple(Violation("privileged", f"c{i}", "privileged: " + "x" * n) for i, n in enumerate(lengths))

    class Many(StandInPolicy):
        def validate(self, pod, config, *, only=None, namespace=None):
            return Validation(violations, tuple(stand_in_advice(text) for text in advice))

    warned = review(crowded(1), Endpoint.VALIDATE_WARN, None, Many()).response["response"]
    warnings = warned.get("warnings", [])
    assert sum(len(w) for w in warnings) <= review_module.WARNING_BUDGET_CHARS
    assert all(len(w) <= MAX_WARNING_CHARS for w in warnings)
    groups = len(violations) + len(advice) + 1  # and what enforcing would pin (the one container)
    firsts = [w for w in warnings if not w.startswith(CONTINUATION)]  # each violation's or advice's first line
    if warnings and re.match(r"gpu-fence: … and ", warnings[-1]):
        counted = sum(int(n) for n in re.findall(r"(\d+) more (?:violation|warning)s?", warnings[-1]))
        assert len(firsts) - 1 + counted == groups
    else:
        assert len(firsts) == groups
    if violations:
        denied = review(crowded(1), Endpoint.VALIDATE, None, Many()).response["response"]
        assert len(denied["status"]["message"]) <= review_module.MAX_DENY_MESSAGE_CHARS
        assert sum(len(w) for w in denied.get("warnings", [])) <= review_module.WARNING_BUDGET_CHARS


# -- scoping: which requests are judged, and on what -------------------------------------------------------------


def test_ephemeral_container_update_judges_only_the_new_container():
    body = load("pod-update-ephemeralcontainers")
    assert new_container_names(parse(body)) == frozenset({"debugger-abc12"})
    policy = StandInPolicy()
    outcome = review(body, Endpoint.MUTATE, None, policy)
    assert ("mutate", frozenset({"debugger-abc12"})) in policy.calls
    pod = mutated(body)
    new = pod["spec"]["ephemeralContainers"][1]
    assert new["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    # the pod's regular containers were not touched by an ephemeral-containers update
    assert pod["spec"]["containers"] == body["request"]["object"]["spec"]["containers"]
    assert outcome.response["response"]["auditAnnotations"] == {"pinned": "debugger-abc12"}
    denied = review(body, Endpoint.VALIDATE, None, StandInPolicy())
    assert denied.response["response"]["allowed"] is False
    assert "debugger-abc12" in denied.response["response"]["status"]["message"]
    assert "log-shipper" not in denied.response["response"]["status"]["message"]


def test_ephemeral_update_without_a_new_container_is_allowed_unjudged():
    body = load("pod-update-ephemeralcontainers")
    body["request"]["object"] = copy.deepcopy(body["request"]["oldObject"])
    policy = StandInPolicy()
    outcome = review(body, Endpoint.VALIDATE, None, policy)
    assert outcome.verdict is ReviewVerdict.ALLOWED
    assert not [call for call in policy.calls if call[0] == "validate"]


@pytest.mark.parametrize("name", ["pod-delete", "deployment-create"])
def test_other_operations_and_kinds_are_allowed_without_evaluation(name):
    policy = StandInPolicy()
    for endpoint in Endpoint:
        outcome = review(load(name), endpoint, None, policy)
        assert outcome.verdict is ReviewVerdict.ALLOWED
        assert outcome.response["response"] == {"uid": load(name)["request"]["uid"], "allowed": True}
    assert policy.calls == []


def test_status_and_other_subresource_updates_are_not_judged():
    body = load("pod-update-ephemeralcontainers")
    policy = StandInPolicy()
    for sub_resource in ("status", "resize", "binding"):
        body["request"]["subResource"] = sub_resource
        assert review(body, Endpoint.VALIDATE, None, policy).verdict is ReviewVerdict.ALLOWED
    assert policy.calls == []


def test_plain_pod_update_is_judged_by_validate_update_only():
    body = load("pod-update-ephemeralcontainers")
    body["request"]["subResource"] = ""
    policy = StandInPolicy()
    assert review(body, Endpoint.MUTATE, None, policy).verdict is ReviewVerdict.ALLOWED
    assert review(body, Endpoint.VALIDATE, None, policy).verdict is ReviewVerdict.ALLOWED
    assert [call[0] for call in policy.calls] == ["exemption", "exemption", "validate_update"]
    failing = StandInPolicy(fail=RuntimeError("boom"))
    assert review(body, Endpoint.VALIDATE, None, failing).response["response"]["allowed"] is False


def test_exempt_pods_are_allowed_untouched_with_an_audit_annotation():
    mirror = review(load("pod-create-mirror"), Endpoint.MUTATE, None, StandInPolicy())
    assert mirror.verdict is ReviewVerdict.EXEMPT
    assert mirror.response["response"] == {
        "uid": load("pod-create-mirror")["request"]["uid"],
        "allowed": True,
        "auditAnnotations": {"exempt": "mirror pod"},
    }
    body = load("pod-create-replicaset-gpu-mix")
    body["request"]["namespace"] = "kube-system"
    outcome = review(body, Endpoint.VALIDATE, None, StandInPolicy())
    assert outcome.verdict is ReviewVerdict.EXEMPT and outcome.response["response"]["allowed"] is True


def test_namespace_comes_from_the_request_not_the_object(gpu_mix):
    gpu_mix["request"]["namespace"] = "kube-system"
    gpu_mix["request"]["object"]["metadata"]["namespace"] = ""
    policy = StandInPolicy()
    review(gpu_mix, Endpoint.VALIDATE, None, policy)
    assert policy.calls[0] == ("exemption", "kube-system")
    # an older API server may send an empty request.namespace: the object's is the fallback
    gpu_mix["request"]["namespace"] = ""
    gpu_mix["request"]["object"]["metadata"]["namespace"] = "team-a"
    assert parse(gpu_mix).namespace == "team-a"


def test_name_for_logs_falls_back_to_generate_name():
    assert parse(load("pod-create-replicaset-gpu-mix")).name == "trainer-7d9f8c6b5d-*"
    assert parse(load("pod-create-kubectl")).name == "nginx"


def test_dry_run_gets_the_same_answer():
    dry = review(load("pod-create-dryrun"), Endpoint.MUTATE, None, StandInPolicy())
    wet = review(load("pod-create-replicaset-gpu-mix"), Endpoint.MUTATE, None, StandInPolicy())
    assert dry.request.dry_run is True
    assert dry.response["response"]["patch"] == wet.response["response"]["patch"]


# -- internal errors: fail closed on /validate only -------------------------------------------------------------


def test_internal_error_in_validate_denies_fail_closed():
    outcome = review(load("pod-create-kubectl"), Endpoint.VALIDATE, None, StandInPolicy(fail=KeyError("spec")))
    response = outcome.response["response"]
    assert outcome.verdict is ReviewVerdict.ERROR
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "fail closed" in response["status"]["message"] and "KeyError" in response["status"]["message"]
    assert outcome.error == "KeyError: 'spec'"


@pytest.mark.parametrize("endpoint", [Endpoint.MUTATE, Endpoint.VALIDATE_WARN])
def test_internal_error_elsewhere_allows_without_patch(endpoint):
    outcome = review(load("pod-create-kubectl"), endpoint, None, StandInPolicy(fail=RuntimeError("boom")))
    response = outcome.response["response"]
    assert outcome.verdict is ReviewVerdict.ERROR
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response
    assert response["auditAnnotations"]["error"] == "RuntimeError: boom"


# -- bad envelopes ----------------------------------------------------------------------------------------------


def _broken(change) -> dict:
    body = load("pod-create-kubectl")
    change(body)
    return body


@pytest.mark.parametrize(
    ("body", "reason", "needle"),
    [
        ([1, 2], BadRequestReason.NOT_AN_OBJECT, "JSON object"),
        ("AdmissionReview", BadRequestReason.NOT_AN_OBJECT, "JSON object"),
        (_broken(lambda b: b.update(kind="Pod")), BadRequestReason.WRONG_KIND, "kind must be 'AdmissionReview'"),
        (_broken(lambda b: b.pop("apiVersion")), BadRequestReason.WRONG_API_VERSION, "admissionReviewVersions"),
        (load("pod-create-v1beta1"), BadRequestReason.WRONG_API_VERSION, "admission.k8s.io/v1beta1"),
        (_broken(lambda b: b.pop("request")), BadRequestReason.MISSING_REQUEST, "request"),
        (_broken(lambda b: b.update(request=[])), BadRequestReason.MISSING_REQUEST, "request"),
        (_broken(lambda b: b["request"].pop("uid")), BadRequestReason.MISSING_UID, "request.uid"),
        (_broken(lambda b: b["request"].update(uid="")), BadRequestReason.MISSING_UID, "request.uid"),
        (_broken(lambda b: b["request"].update(uid=7)), BadRequestReason.MISSING_UID, "request.uid"),
        (_broken(lambda b: b["request"].pop("operation")), BadRequestReason.MISSING_OPERATION, "request.operation"),
        (
            _broken(lambda b: b["request"].update(object=None)),
            BadRequestReason.MALFORMED_REQUEST,
            "request.object is required",
        ),
        (
            _broken(lambda b: b["request"].update(object="pod")),
            BadRequestReason.MALFORMED_REQUEST,
            "request.object must be",
        ),
        (_broken(lambda b: b["request"].update(oldObject=[])), BadRequestReason.MALFORMED_REQUEST, "request.oldObject"),
        (
            _broken(lambda b: b["request"]["object"].update(spec=[])),
            BadRequestReason.MALFORMED_REQUEST,
            "spec must be an object",
        ),
        (_broken(lambda b: b["request"].update(namespace=3)), BadRequestReason.MALFORMED_REQUEST, "request.namespace"),
    ],
)
def test_bad_envelopes_raise_a_clear_bad_review(body, reason, needle):
    with pytest.raises(BadReview) as caught:
        review(body, Endpoint.VALIDATE, None, StandInPolicy())
    assert caught.value.reason == reason
    assert needle in caught.value.message
    assert caught.value.status == 400


# -- properties -------------------------------------------------------------------------------------------------


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    request=st.fixed_dictionaries(
        {"uid": st.text(min_size=1, max_size=8), "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "X"])},
        optional={
            "kind": json_values,
            "object": json_values,
            "oldObject": json_values,
            "subResource": json_values,
            "namespace": json_values,
            "name": json_values,
            "dryRun": json_values,
        },
    ),
    endpoint=st.sampled_from(list(Endpoint)),
)
def test_no_request_shape_escapes_as_anything_but_an_answer_or_bad_review(request, endpoint):
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    try:
        outcome = review(body, endpoint, None, StandInPolicy())
    except BadReview as bad:
        assert bad.message
    else:
        assert outcome.response["response"]["uid"] == request["uid"]


# -- with the real policy: the envelope and the policy together ------------------------------------------------

REAL_CONFIG = PolicyConfig()


def envelope(pod, *, operation="CREATE", sub_resource="", old=None, namespace="team-a") -> dict:
    request = {
        "uid": "3b1f0c2e-0000-4000-8000-000000000abc",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "object": pod,
        "oldObject": old,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@settings(max_examples=150, deadline=None)
@given(pod=pods())
def test_real_policy_patch_applies_is_idempotent_and_leaves_nothing_unpinned(pod):
    first = review(envelope(pod), Endpoint.MUTATE, REAL_CONFIG, real_policy)
    assert first.verdict in (ReviewVerdict.PATCHED, ReviewVerdict.ALLOWED, ReviewVerdict.EXEMPT)
    patch = first.response["response"].get("patch")
    patched = pod if patch is None else jsonpatch.apply_patch(pod, json.loads(base64.b64decode(patch)))
    second = review(envelope(patched), Endpoint.MUTATE, REAL_CONFIG, real_policy)
    assert "patch" not in second.response["response"]
    checked = review(envelope(patched), Endpoint.VALIDATE, REAL_CONFIG, real_policy)
    assert checked.verdict is not ReviewVerdict.ERROR
    assert "unpinned-container" not in checked.rules


@settings(max_examples=150, deadline=None)
@given(pod=mangled_pods(), endpoint=st.sampled_from(list(Endpoint)))
def test_real_policy_on_mangled_pods_answers_or_refuses_never_errors(pod, endpoint):
    try:
        outcome = review(envelope(pod), endpoint, REAL_CONFIG, real_policy)
    except BadReview as bad:
        assert bad.message
    else:
        assert outcome.verdict is not ReviewVerdict.ERROR, outcome.error


def test_real_policy_ephemeral_update_pins_only_the_new_container():
    body = load("pod-update-ephemeralcontainers")
    outcome = review(body, Endpoint.MUTATE, REAL_CONFIG, real_policy)
    patch = json.loads(base64.b64decode(outcome.response["response"]["patch"]))
    assert patch and all(op["path"].startswith("/spec/ephemeralContainers/1") for op in patch)
    denied = review(body, Endpoint.VALIDATE, REAL_CONFIG, real_policy).response["response"]
    assert denied["allowed"] is False and "debugger-abc12" in denied["status"]["message"]
    assert "log-shipper" not in denied["status"]["message"]


# -- a plain pod UPDATE can still add annotations ----------------------------------------------------------------


def _annotation_update(old: dict | None, new: dict | None) -> dict:
    """A plain (no subresource) Pod UPDATE that changes only the annotations, as `kubectl annotate` sends it."""
    body = load("pod-update-ephemeralcontainers")
    request = body["request"]
    request["subResource"] = request["requestSubResource"] = ""
    request["object"] = copy.deepcopy(request["oldObject"])
    for target, wanted in ((request["oldObject"], old), (request["object"], new)):
        if wanted is not None:
            target["metadata"]["annotations"] = wanted
    return body


def test_plain_pod_update_adding_a_cdi_annotation_is_denied():
    # A pod held by a scheduling gate (or still pending) gets its sandbox only later: an annotation added by an
    # UPDATE reaches the runtime (NRI plugin, V9) exactly like one set at CREATE.
    body = _annotation_update(None, {"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"})
    denied = review(body, Endpoint.VALIDATE, REAL_CONFIG, real_policy)
    assert denied.verdict is ReviewVerdict.DENIED and denied.rules == ("cdi-annotation",)
    assert "nvidia.cdi.k8s.io/pod" in denied.response["response"]["status"]["message"]
    warned = review(body, Endpoint.VALIDATE_WARN, REAL_CONFIG, real_policy)
    assert warned.verdict is ReviewVerdict.WARNED and warned.response["response"]["allowed"] is True
    mutate = review(body, Endpoint.MUTATE, REAL_CONFIG, real_policy)
    assert mutate.verdict is ReviewVerdict.ALLOWED and "patch" not in mutate.response["response"]


def test_plain_pod_update_judges_only_annotations_it_adds_or_changes():
    # An annotation that was already there was judged at CREATE (or let through in warn mode): denying it now
    # would block every later update of the pod, finalizer removal included.
    kept = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}
    assert (
        review(_annotation_update(kept, {**kept, "team": "a"}), Endpoint.VALIDATE, REAL_CONFIG, real_policy).verdict
        is ReviewVerdict.ALLOWED
    )
    changed = review(
        _annotation_update(kept, {"cdi.k8s.io/x": "nvidia.com/gpu=all"}), Endpoint.VALIDATE, REAL_CONFIG, real_policy
    )
    assert changed.verdict is ReviewVerdict.DENIED
    # the containers of an existing pod are not re-judged on a plain update (their env cannot change)
    unpinned = _annotation_update(None, {"team": "a"})
    assert review(unpinned, Endpoint.VALIDATE, REAL_CONFIG, real_policy).verdict is ReviewVerdict.ALLOWED


def test_plain_pod_update_in_an_exempt_namespace_is_exempt():
    body = _annotation_update(None, {"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"})
    body["request"]["namespace"] = "kube-system"
    assert review(body, Endpoint.VALIDATE, REAL_CONFIG, real_policy).verdict is ReviewVerdict.EXEMPT
