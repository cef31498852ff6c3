"""The manifests of common stacks (``tests/webhook/data/stacks/``) through the webhook served over real TLS, as the
API server sends them: the pod each makes, in the namespace its object names.

In an enforced namespace the ordinary workloads are pinned by ``/mutate`` and admitted by ``/validate``; what reaches
the node is denied, the message naming its way out once. In a warn namespace (no mutating webhook runs there) each
is admitted, what enforcing would pin is said once instead of as an ``unpinned-container`` per container, and every
warning fits the API server's 120 characters.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Iterator

import jsonpatch
import pytest

from tests.fakes import pods
from tests.fakes.stacks import StackPod, stack_pods
from tests.fakes.webhook_server import Server, serving

pytestmark = pytest.mark.e2e

STACK_PODS = stack_pods()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("webhook")) as started:
        yield started


def review_of(stack: StackPod) -> dict:
    """A Pod CREATE as the API server sends it (``admission.k8s.io/v1``)."""
    pod = copy.deepcopy(stack.pod)
    pod["metadata"] = {**pod["metadata"], "namespace": stack.namespace}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"].get("name", ""),
            "namespace": stack.namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def pinned_by(patch: list[dict]) -> set[str]:
    """The containers a patch pins, by the container each operation's path points at."""
    names = set()
    for operation in patch:
        assert operation["op"] == "add" and "NVIDIA_VISIBLE_DEVICES" in json.dumps(operation["value"])
        names.add(operation["path"].split("/")[3])
    return names


def mutated(server: Server, review: dict) -> dict:
    response = server.post("/mutate", review).document["response"]
    assert response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    pod = jsonpatch.apply_patch(review["request"]["object"], patch)
    pods.assert_valid_pod(pod)
    spec = pod["spec"]
    indexes = pinned_by(patch)
    every = [*spec.get("initContainers", []), *spec["containers"]]
    assert len(indexes) <= len(every)
    return pod


@pytest.mark.parametrize("stack", STACK_PODS, ids=lambda stack: stack.id)
def test_enforced_namespace_pins_admits_or_denies_naming_the_way_out(server: Server, stack: StackPod) -> None:
    review = review_of(stack)
    pod = mutated(server, review)
    pinned = [
        c["name"]
        for c in (*pod["spec"].get("initContainers", []), *pod["spec"]["containers"])
        if {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in c.get("env", [])
        and c not in (*stack.pod["spec"].get("initContainers", []), *stack.pod["spec"]["containers"])
    ]
    assert sorted(pinned) == sorted(stack.expected.pinned)
    review["request"]["object"] = pod
    response = server.post("/validate", review).document["response"]
    if stack.expected.verdict != "rejected":
        assert response["allowed"] is True and "warnings" not in response, response
        return
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert set(response["auditAnnotations"]["rules"].split(",")) == stack.expected.rules
    message = response["status"]["message"]
    assert message.count(stack.expected.way_out) == 1, message  # said once, however many violations share it
    assert all(f"{rule}: " in message for rule in stack.expected.rules)


@pytest.mark.parametrize("stack", STACK_PODS, ids=lambda stack: stack.id)
def test_warn_namespace_admits_says_what_it_would_pin_once_and_keeps_warnings_short(
    server: Server, stack: StackPod
) -> None:
    response = server.post("/validate/warn", review_of(stack)).document["response"]
    assert response["allowed"] is True and "patch" not in response
    warnings = response.get("warnings", [])
    assert all(len(warning) <= 120 for warning in warnings)
    assert not any("unpinned-container" in warning for warning in warnings)
    would_pin = [w for w in warnings if w.startswith("gpu-fence: enforce mode would pin")]
    count = len(stack.expected.pinned)
    if count:
        assert len(would_pin) == 1 and f"would pin {count} container" in would_pin[0]
    else:
        assert would_pin == []
    if stack.expected.verdict == "rejected":
        led = {w.split(":", 1)[0] for w in warnings if not w.startswith(("gpu-fence", " "))}
        assert led == stack.expected.rules  # each violation leads with its rule id
        said = " ".join(w.strip() for w in warnings)
        assert said.count(stack.expected.way_out) == 1
        assert set(response["auditAnnotations"]["rules"].split(",")) == stack.expected.rules
    else:
        assert warnings == would_pin and "auditAnnotations" not in response
