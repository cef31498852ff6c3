"""RBAC grants exactly what each component needs, compared with an explicit allowlist, and nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import KUSTOMIZATIONS, NAMESPACE, find, one, pod_spec, render

#: (service account, scope, API group, resource, verb, resource name or "*") — scope is the namespace of a Role
#: or "cluster" for a ClusterRole. Anything rendered and not listed here fails the test, and so does anything
#: listed and not rendered.
AUDITOR_GRANTS = {
    ("gpu-fence-auditor", "cluster", "", "pods", "list", "*"),
    ("gpu-fence-auditor", "cluster", "resource.k8s.io", "resourceslices", "list", "*"),
    ("gpu-fence-auditor", "cluster", "resource.k8s.io", "resourceslices", "watch", "*"),
    ("gpu-fence-auditor", "cluster", "", "events", "create", "*"),
    ("gpu-fence-auditor", "cluster", "", "events", "patch", "*"),
}
CERTS_GRANTS = {
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "get", "gpu-fence-webhook-tls"),
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "update", "gpu-fence-webhook-tls"),
    # "create" cannot be limited by name; namespace-bound (see certs-rbac.yaml and docs/operations.md).
    ("gpu-fence-certs", NAMESPACE, "", "secrets", "create", "*"),
    (
        "gpu-fence-certs",
        "cluster",
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "get",
        "gpu-fence-mutating",
    ),
    (
        "gpu-fence-certs",
        "cluster",
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "patch",
        "gpu-fence-mutating",
    ),
    (
        "gpu-fence-certs",
        "cluster",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "get",
        "gpu-fence-validating",
    ),
    (
        "gpu-fence-certs",
        "cluster",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "patch",
        "gpu-fence-validating",
    ),
}
EXPECTED = {
    "base": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/cert-manager": AUDITOR_GRANTS,
    "overlays/gpu-operator": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/warn-only": AUDITOR_GRANTS | CERTS_GRANTS,
    "overlays/vap": AUDITOR_GRANTS | CERTS_GRANTS,
}


def grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str, str, str, str]]:
    roles = {
        (o["kind"], o["metadata"].get("namespace", "cluster"), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
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
    [job] = find(objects, "Job")
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


# -- what the code really calls ------------------------------------------------------------------------------------
# The allowlists above say what the manifests grant; the tests below say what the programs use, by running them with
# the manifests' own arguments against the API fakes and turning every request into (resource, verb, name). A grant
# that nothing uses is excess privilege; a call that nothing grants is a 403 in the cluster.

_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _request_grant(
    method: str, path: str, query: dict[str, list[str]] | None = None
) -> tuple[str, str, str, str] | None:
    """(API group, resource, verb, name or "*") that the API server authorizes for one request; None for discovery
    (``/api``, ``/apis/<group>[/<version>]``): non-resource URLs every authenticated user may read through the
    default ``system:discovery`` role, so no Role of ours grants them."""
    parts = [p for p in path.split("/") if p]
    if (parts[:1] == ["api"] and len(parts) <= 2) or (parts[:1] == ["apis"] and len(parts) <= 3):
        return None
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, name = rest[0], (rest[1] if len(rest) > 1 else "*")
    verb = _VERBS[method]
    if method == "GET" and name == "*":
        verb = "watch" if (query or {}).get("watch", ["false"])[0] in ("true", "1") else "list"
    return group, resource, verb, name


def _covered(
    used: set[tuple[str, str, str, str]], granted: set[tuple[str, str, str, str, str, str]], account: str
) -> None:
    mine = {(g[2], g[3], g[4], g[5]) for g in granted if g[0] == account}
    for call in used:
        assert call in mine or (*call[:3], "*") in mine, f"{account} calls {call} but no Role grants it"
    unused = {
        grant for grant in mine if grant not in used and not (grant[3] == "*" and any(c[:3] == grant[:3] for c in used))
    }
    assert not unused, f"{account} is granted {sorted(unused)} but never makes that call"


def test_certificate_job_is_granted_exactly_the_calls_certs_makes(tmp_path: Path) -> None:
    from gpu_fence.webhook import cli
    from tests.fakes.kubeapi_webhooks import FakeKubeApi, FakeKubeApiServer

    objects = render("base")
    args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in _certs_args(find(objects, "Job")[0])]
    api = FakeKubeApi()
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            kind = obj["kind"].removesuffix("WebhookConfiguration").lower()
            api.add_webhooks(kind, obj["metadata"]["name"], [hook["name"] for hook in obj["webhooks"]])
    with FakeKubeApiServer(api) as server:
        argv = ["certs", *args[1:], "--kubeconfig", str(server.kubeconfig(tmp_path))]
        assert cli.main(argv) == 0  # first run: creates the Secret
        assert cli.main(argv) == 0  # nothing to do
        secret = api.secrets[(NAMESPACE, "gpu-fence-webhook-tls")]
        secret["data"]["tls.crt"] = ""  # a broken serving certificate: renewed in place
        assert cli.main(argv) == 0
    used = {grant for method, path in api.log if (grant := _request_grant(method, path)) is not None}
    assert ("", "secrets", "update", "gpu-fence-webhook-tls") in used, "the renewal path was exercised"
    _covered(used, grants(objects), "gpu-fence-certs")


def test_auditor_is_granted_exactly_the_calls_it_makes(tmp_path: Path) -> None:
    from gpu_fence.auditor.kube import EventRecorder, PodCache, load_api_client
    from gpu_fence.auditor.model import ContainerRef, Finding, FindingKind, SliceState
    from gpu_fence.auditor.resourceslices import ResourceSliceCache
    from tests.fakes.kubeapi_pods_events import FakeKubeApi, make_pod
    from tests.fakes.kubeapi_resourceslices import DraGpu, nvidia_slice
    from tests.fakes.prometheus import wait_for

    now = [1000.0]
    fake = FakeKubeApi().start()
    slices = None
    try:
        fake.add_pod(make_pod("ml", "train", "uid-1", "gpu-node-1", [("main", "a" * 64)]))
        fake.resource_slices.put(nvidia_slice("gpu-node-1", [DraGpu(0, 0, "GPU-1")]))
        client = load_api_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        pods = PodCache(client, "gpu-node-1", clock=lambda: now[0])
        assert pods.refresh()
        slices = ResourceSliceCache(client, "gpu-node-1")
        assert slices.sync()  # discovery, then the list
        slices.start()  # then the watch
        wait_for(lambda: slices.watches, 10, "the watch to open", interval=0.02)
        assert slices.view.state is SliceState.FRESH
        events = EventRecorder(client, "gpu-node-1", reemit_after=60, clock=lambda: now[0])
        finding = Finding(
            FindingKind.USED_UNALLOCATED,
            ContainerRef("ml", "train", "main", "uid-1"),
            "GPU-1",
            pid=1,
            memory_bytes=1,
            message="m",
        )
        assert events.record([finding]) == 1  # create
        now[0] += 61
        assert events.record([finding]) == 1  # re-emit: patch
        fake.events.clear()
        now[0] += 61
        assert events.record([finding]) == 1  # the Event expired meanwhile: patch answers 404, then create
    finally:
        if slices is not None:
            slices.close()
        fake.stop()
    used = {grant for method, path, query in fake.requests if (grant := _request_grant(method, path, query))}
    _covered(used, grants(render("base")), "gpu-fence-auditor")
