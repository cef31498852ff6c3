"""Who may call the webhook, as rendered: the NetworkPolicy of overlays/network-policy, the client-certificate
settings of overlays/client-auth, and docs/install.md's step 5 agreeing with both."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_fence.webhook.cli import build_parser
from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, REPO, kubectl, one, render
from .selectors import selector_matches

INSTALL = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
STEP_5 = INSTALL[INSTALL.index("## 5. Restrict who may call the webhook") :]


def webhook_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment", "gpu-fence-webhook")
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "webhook"]
    return container


def test_the_policy_admits_the_api_server_and_the_scraper_on_the_webhook_port_and_nothing_out() -> None:
    objects = render("overlays/network-policy")
    policy = one(objects, "NetworkPolicy", "gpu-fence-webhook")
    pod_labels = one(objects, "Deployment", "gpu-fence-webhook")["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(policy["spec"]["podSelector"], pod_labels)
    others = [w for w in objects if w["kind"] in ("DaemonSet", "Job", "CronJob")]
    for workload in others:  # the auditor and the certificate jobs are not the webhook
        template = workload["spec"].get("template") or workload["spec"]["jobTemplate"]["spec"]["template"]
        assert not selector_matches(policy["spec"]["podSelector"], template["metadata"].get("labels", {}))
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"] and policy["spec"]["egress"] == []
    api_server, scraper = policy["spec"]["ingress"]
    port_names = {port["name"] for port in webhook_container(objects)["ports"]}
    for rule in (api_server, scraper):
        assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", "https")] and "https" in port_names
    [source] = api_server["from"]
    assert set(source) == {"ipBlock"}  # the API server runs on the host network: only its addresses match it
    [namespace] = scraper["from"]
    assert namespace == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def test_the_api_server_range_must_be_set_before_the_policy_applies() -> None:
    policy = one(render("overlays/network-policy"), "NetworkPolicy", "gpu-fence-webhook")
    placeholder = policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"]
    with pytest.raises(ValueError):  # the API server refuses it: no silent lock-out with a guessed range
        ipaddress.ip_network(placeholder)


def test_the_install_guides_kustomization_sets_the_range(tmp_path: Path) -> None:
    block = re.search(
        r"```yaml\n(resources:\n  - <path-or-git-url-to-gpu-fence>/manifests/overlays/network.*?)```", STEP_5, re.S
    )
    assert block, "the NetworkPolicy kustomization of step 5"
    directory = tmp_path / "mine"
    directory.mkdir()
    text = block.group(1).replace("<path-or-git-url-to-gpu-fence>/manifests", os.path.relpath(MANIFESTS, directory))
    (directory / "kustomization.yaml").write_text(text, encoding="utf-8")
    result = run_captured([kubectl(), "kustomize", str(directory)], timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    policy = one(objects, "NetworkPolicy", "gpu-fence-webhook")
    assert ipaddress.ip_network(policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"])


def test_client_auth_serves_with_the_mounted_client_ca_and_the_api_servers_cn() -> None:
    objects = render("overlays/client-auth")
    container = webhook_container(objects)
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    directory, _, file_name = args.client_ca_file.rpartition("/")
    volume_name = mounts[directory]
    [volume] = [
        v
        for v in one(objects, "Deployment", "gpu-fence-webhook")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == volume_name
    ]
    config_map = volume["configMap"]
    assert not config_map.get("optional") and [item["path"] for item in config_map["items"]] == [file_name]
    # what step 5 tells the reader to create is what the overlay mounts, and the CN it issues is the one required
    assert f"create configmap {config_map['name']} --from-file={config_map['items'][0]['key']}=" in STEP_5
    assert args.client_cn == ["kube-apiserver"] and '-subj "/CN=kube-apiserver"' in STEP_5


def test_the_api_servers_kubeconfig_names_the_webhooks_service() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", STEP_5, re.S)
    documents = [
        yaml.safe_load(block) for block in blocks if "kind: Config" in block or "AdmissionConfiguration" in block
    ]
    admission = next(d for d in documents if d["kind"] == "AdmissionConfiguration")
    kubeconfig = next(d for d in documents if d["kind"] == "Config")
    assert {p["name"] for p in admission["plugins"]} == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    assert {p["configuration"]["kind"] for p in admission["plugins"]} == {"WebhookAdmissionConfiguration"}
    [user] = kubeconfig["users"]
    for configuration in render("base"):
        if configuration["kind"].endswith("WebhookConfiguration"):
            for hook in configuration["webhooks"]:
                service = hook["clientConfig"]["service"]
                assert user["name"] == f"{service['name']}.{service['namespace']}.svc" and service["port"] == 443
    for field in ("client-certificate", "client-key"):
        assert Path(user["user"][field]).name in STEP_5.split("```sh", 1)[1].split("```", 1)[0]  # openssl writes it


def test_only_the_scraper_reaches_the_auditor_and_on_its_metrics_port_only() -> None:
    objects = render("overlays/network-policy")
    policy = one(objects, "NetworkPolicy", "gpu-fence-auditor")
    daemonset = one(objects, "DaemonSet", "gpu-fence-auditor")
    assert selector_matches(policy["spec"]["podSelector"], daemonset["spec"]["template"]["metadata"]["labels"])
    webhook = one(objects, "Deployment", "gpu-fence-webhook")["spec"]["template"]["metadata"]["labels"]
    assert not selector_matches(policy["spec"]["podSelector"], webhook)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", "metrics")] and ports == {"metrics": 10400}
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
