"""The two verdict vocabularies meet as ``gpu_fence.verdicts`` says: the table in its docstring is checked against the
real policy (a pod's ``Verdict``) and the real review envelope (each endpoint's ``ReviewVerdict``), with the
validating endpoints judging the pod as the mutating one left it, as the API server sends it."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from gpu_fence import verdicts
from gpu_fence.verdicts import ReviewVerdict, Verdict
from gpu_fence.webhook import policy
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.review import Endpoint, review
from tests.fakes.pods import container, gpu_container, pod

CONFIG = PolicyConfig()


def documented_table() -> dict[Verdict, tuple[set[ReviewVerdict], ReviewVerdict, ReviewVerdict]]:
    """The rows of the docstring's table: per pod verdict, the answers of /mutate, /validate, /validate/warn."""
    doc = verdicts.__doc__ or ""
    rows: dict[Verdict, tuple[set[ReviewVerdict], ReviewVerdict, ReviewVerdict]] = {}
    for line in doc.splitlines():
        cells = line.split()
        if len(cells) == 4 and cells[0] in set(Verdict):
            mutate = {ReviewVerdict(name) for name in cells[1].split("/")}
            rows[Verdict(cells[0])] = (mutate, ReviewVerdict(cells[2]), ReviewVerdict(cells[3]))
    return rows


def envelope(document: dict, namespace: str) -> dict:
    request = {
        "uid": "0b7a8a5e-0000-4000-8000-000000000001",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": document,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answers(document: dict, namespace: str) -> tuple[ReviewVerdict, ReviewVerdict, ReviewVerdict]:
    mutated = review(envelope(document, namespace), Endpoint.MUTATE, CONFIG, policy)
    patch = mutated.response["response"].get("patch")
    after = document if patch is None else jsonpatch.apply_patch(document, json.loads(base64.b64decode(patch)))
    validated = review(envelope(after, namespace), Endpoint.VALIDATE, CONFIG, policy)
    warned = review(envelope(after, namespace), Endpoint.VALIDATE_WARN, CONFIG, policy)
    return mutated.verdict, validated.verdict, warned.verdict


PODS = {
    "a GPU container alone": (pod(gpu_container()), "team-a"),
    "a container to pin": (pod(container()), "team-a"),
    "privileged, and to pin": (pod(container(securityContext={"privileged": True})), "team-a"),
    "privileged GPU container": (pod(gpu_container(securityContext={"privileged": True})), "team-a"),
    "an exempt namespace": (pod(container(securityContext={"privileged": True})), "kube-system"),
}


def test_the_table_has_a_row_for_every_pod_verdict():
    assert set(documented_table()) == set(Verdict)


@pytest.mark.parametrize("name", list(PODS))
def test_each_endpoint_answers_a_pod_as_the_table_says(name):
    document, namespace = PODS[name]
    verdict = policy.evaluate(document, CONFIG, namespace=namespace).verdict
    mutate, validate, warn = documented_table()[verdict]
    answered = answers(document, namespace)
    assert answered[0] in mutate and answered[1:] == (validate, warn)


def test_the_examples_cover_every_pod_verdict_and_every_answer_but_error():
    seen = {policy.evaluate(document, CONFIG, namespace=namespace).verdict for document, namespace in PODS.values()}
    answered = {verdict for document, namespace in PODS.values() for verdict in answers(document, namespace)}
    assert seen == set(Verdict)
    assert answered == set(ReviewVerdict) - {ReviewVerdict.ERROR}


def test_a_verdict_is_its_name_wherever_text_is_written():
    assert f"{Verdict.REJECTED:<9}|" == "rejected |" and json.dumps({"v": ReviewVerdict.PATCHED}) == '{"v": "patched"}'
