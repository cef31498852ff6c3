"""RBAC grants exactly what each component needs, compared with an explicit allowlist, and nothing more."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import KUSTOMIZATIONS, NAMESPACE, find, one, pod_spec, render

#: (service account, scope, API group, resource, verb, resource name or "*") — scope is the namespace of a Role
#: or "cluster" for a ClusterRole. Anything rendered and not listed here fails the test, and so does anything
#: listed and not rendered.
AUDITOR_GRANTS = {
    ("gpu-fence-auditor", "cluster", "", "pods", "list", "*"),
    ("gpu-fence-auditor", "cluster", "", "pods", "watch", "*"),
    ("gpu-fence-auditor", "cluster", "", "events", "create", "*"),
    ("gpu-fence-auditor", "cluster", "", "events", "patch", "*"),
}
CERTS_GRANTS = {
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "get", "gpu-fence-webhook-tls"),
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "update", "gpu-fence-webhook-tls"),
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "patch", "gpu-fence-webhook-tls"),
    # "create" cannot be limited by name; namespace-bound (see certs-rbac.yaml and docs/operations.md).
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "create", "*"),
    ("gpu-fence-certs", "cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get",
     "gpu-fence-mutating"),
    ("gpu-fence-certs", "cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch",
     "gpu-fence-mutating"),
    ("gpu-fence-certs", "cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "get",
     "gpu-fence-validating"),
    ("gpu-fence-certs", "cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch",
     "gpu-fence-validating"),
}
EXPECTED = {
    "base": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/cert-manager": AUDITOR_GRANTS,
    "overlays/gpu-operator": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/warn-only": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/vap": AUDITOR_GRANTS | CERTS_GRANTS,
}


def grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str, str, str, str]]:
    roles = {(o["kind"], o["metadata"].get("namespace", "cluster"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    found: set[tuple[str, str, str, str, str, str]] = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace", "cluster") if binding["kind"] == "RoleBinding" else "cluster"
        role_scope = "cluster" if ref["kind"] == "ClusterRole" else scope
        role = roles[(ref["kind"], role_scope, ref["name"])]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE, subject
            for rule in role["rules"]:
                assert "nonResourceURLs" not in rule
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or ["*"]:
                                found.add((subject["name"], scope, group, resource, verb, name))
    return found


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_rbac_grants_exactly_the_allowlist(target: str) -> None:
    expected = EXPECTED.get(target)
    if expected is None:  # an overlay that adds no RBAC of its own (e.g. the prometheus one) keeps the base's
        expected = EXPECTED["base"]
    assert grants(render(target)) == expected


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_no_wildcards_and_every_role_is_bound(target: str) -> None:
    objects = render(target)
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objects if b["kind"].endswith("RoleBinding")}
    for role in (o for o in objects if o["kind"] in ("Role", "ClusterRole")):
        assert (role["kind"], role["metadata"]["name"]) in bound
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], field)


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_service_accounts_in_use_exist_and_the_webhook_has_no_token(target: str) -> None:
    objects = render(target)
    accounts = {o["metadata"]["name"]: o for o in find(objects, "ServiceAccount")}
    for workload in (o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob")):
        assert pod_spec(workload)["serviceAccountName"] in accounts
    assert accounts["gpu-fence-webhook"]["automountServiceAccountToken"] is False


def _certs_args(workload: dict[str, Any]) -> list[str]:
    return pod_spec(workload)["containers"][0]["args"]


def _option(args: list[str], flag: str) -> list[str]:
    """The values after ``flag`` up to the next option."""
    start = args.index(flag) + 1
    values: list[str] = []
    for arg in args[start:]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


@pytest.mark.parametrize("target", [t for t in KUSTOMIZATIONS if t != "overlays/cert-manager"])
def test_certificate_job_writes_what_the_webhook_reads(target: str) -> None:
    objects = render(target)
    job = one(objects, "Job", "gpu-fence-certs")
    cronjob = one(objects, "CronJob", "gpu-fence-certs")
    assert _certs_args(job) == _certs_args(cronjob)
    args = _certs_args(job)
    # Kind-qualified: a plain name is looked up as both kinds, and RBAC (by name) answers 403 for the other one.
    kinds = {"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}
    refs = {f"{kinds[o['kind']]}/{o['metadata']['name']}" for o in objects if o["kind"] in kinds}
    assert set(_option(args, "--patch-webhooks")) == refs
    configurations = {ref.split("/", 1)[1] for ref in refs}
    deployment = one(objects, "Deployment", "gpu-fence-webhook")
    secret = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == "tls")["secret"]["secretName"]
    assert _option(args, "--secret") == [secret]
    assert _option(args, "--service") == [one(objects, "Service", "gpu-fence-webhook")["metadata"]["name"]]
    named = {g[5] for g in grants(objects) if g[0] == "gpu-fence-certs"} - {"*"}
    assert named == configurations | {secret}


def test_cert_manager_overlay_issues_the_certificate_the_webhook_reads() -> None:
    objects = render("overlays/cert-manager")
    assert not find(objects, "Job") and not find(objects, "CronJob")
    certificate = one(objects, "Certificate", "gpu-fence-webhook")
    assert certificate["spec"]["secretName"] == "gpu-fence-webhook-tls"
    assert f"gpu-fence-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] in {o["metadata"]["name"] for o in find(objects, "Issuer")}
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/gpu-fence-webhook"
