"""Every alert of the prometheus overlay fires on its first event, has a runbook in docs/operations.md, and the
critical one for "no webhook replica" exists.

The cases run with ``promtool test rules`` against the shipped alert expressions. Each starts from what the
deployables export before anything happens (counters at 0, docs/metrics.md), then the first event, and names the
first evaluation at which the alert must fire and the one before, at which it must not. The annotations are checked
apart (the runbook links); here each alert keeps only its runbook_url, so that a case states what fires, not the
wording of its text.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, REPO

RULES = MANIFESTS / "overlays" / "prometheus" / "rules.yaml"
OPERATIONS = REPO / "docs" / "operations.md"
RUNBOOKS = "https://github.com/gpu-fence/gpu-fence/blob/main/docs/operations.md#"
AUDITOR = {"job": "gpu-fence-auditor", "instance": "10.0.0.7:10400"}
WEBHOOK = {"job": "gpu-fence-webhook", "instance": "10.0.0.9:8443"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


#: (alert, input series, first minute it fires, labels it fires with). Each series starts as the deployable exports
#: it before the event: counters at 0, up at 1.
CASES: list[tuple[str, list[dict[str, str]], int, dict[str, str]]] = [
    (
        "GPUOverreach",  # the first finding at minute 1, held for the rule's 1 m
        [
            series(
                "gpu_fence_overreach_findings",
                {**AUDITOR, "node": "n", "namespace": "ns", "pod": "p", "container": "c", "kind": "used-unallocated"},
                "0 1x20",
            )
        ],
        2,
        {"severity": "critical", "node": "n", "namespace": "ns", "pod": "p", "container": "c"},
    ),
    ("GPUFenceAuditorDown", [series("up", AUDITOR, "1 0x20")], 6, {"severity": "warning", **AUDITOR}),
    (
        "GPUFenceAuditorAbsent",
        [series("up", {"job": "other"}, "1x30")],
        15,
        {"severity": "warning", "job": AUDITOR["job"]},
    ),
    (
        "GPUFenceAuditCyclesFailing",  # from 0, one more failed cycle every minute, for the rule's 10 m
        [series("gpu_fence_audit_cycle_failures_total", {**AUDITOR, "reason": "nvml"}, "0+1x30")],
        11,
        {"severity": "warning", "instance": AUDITOR["instance"], "reason": "nvml"},
    ),
    (
        "GPUFenceAuditStale",  # the last success at time 0: older than 600 s after minute 10, then 5 m
        [series("gpu_fence_audit_last_success_timestamp_seconds", AUDITOR, "0x30")],
        16,
        {"severity": "warning", **AUDITOR},
    ),
    (
        "GPUFenceWebhookInternalErrors",  # the first internal error, on a series exported at 0 from start
        [series("gpu_fence_webhook_internal_errors_total", {**WEBHOOK, "endpoint": "validate"}, "0 1x20")],
        1,
        {"severity": "warning", "instance": WEBHOOK["instance"], "endpoint": "validate"},
    ),
    ("GPUFenceWebhookDown", [series("up", WEBHOOK, "1 0x20")], 6, {"severity": "warning", **WEBHOOK}),
    (
        "GPUFenceWebhookCertificateExpiresSoon",  # a certificate loaded that ends in 13 days, for the rule's hour
        [series("gpu_fence_webhook_certificate_expiry_timestamp_seconds", WEBHOOK, f"{13 * 86400}x70")],
        60,
        {"severity": "warning", **WEBHOOK},
    ),
    (
        "GPUFenceWebhookCertificateExpiresSoon",  # one that ends in 2 days: critical after 10 m (warning after 60)
        [series("gpu_fence_webhook_certificate_expiry_timestamp_seconds", WEBHOOK, f"{2 * 86400}x70")],
        10,
        {"severity": "critical", **WEBHOOK},
    ),
    (
        "GPUFenceWebhookNoReadyReplica",  # kube-state-metrics: the last available replica goes at minute 1
        [
            series(
                "kube_deployment_status_replicas_available",
                {"job": "kube-state-metrics", "namespace": "gpu-fence", "deployment": "gpu-fence-webhook"},
                "2 0x20",
            ),
            series("up", WEBHOOK, "1x20"),
        ],
        2,
        {
            "severity": "critical",
            "job": "kube-state-metrics",
            "namespace": "gpu-fence",
            "deployment": "gpu-fence-webhook",
        },
    ),
    (
        "GPUFenceWebhookNoReadyReplica",  # without kube-state-metrics: no replica answers a scrape
        [series("up", WEBHOOK, "1 0x20"), series("up", {**WEBHOOK, "instance": "10.0.0.10:8443"}, "1 0x20")],
        2,
        {"severity": "critical"},
    ),
]


def alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def alert_case(alert: str, inputs: list[dict[str, str]], minute: int, labels: dict[str, str]) -> dict[str, Any]:
    rules = alerts(yaml.safe_load(RULES.read_text(encoding="utf-8")))
    severity = labels.get("severity")
    runbooks = {r["annotations"]["runbook_url"] for r in rules if r["alert"] == alert}
    expected = [{"exp_labels": labels, "exp_annotations": {"runbook_url": url}} for url in runbooks]
    tests = [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": expected}]
    if minute > 0:
        tests.insert(0, {"eval_time": f"{minute - 1}m", "alertname": alert, "exp_alerts": []})
    assert severity, alert
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": tests}


def promtool_test(tmp_path: Path, rules: dict[str, Any], cases: list[dict[str, Any]]) -> Any:
    for rule in alerts(rules):  # only the runbook link: the cases state what fires, not the wording
        rule["annotations"] = {"runbook_url": rule["annotations"]["runbook_url"]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    document = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (apt-get install prometheus; CI's .ci/run does)"
    return run_captured([binary, "test", "rules", "tests.yaml"], timeout=120, cwd=tmp_path)


def shipped_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))


def test_every_alert_fires_on_its_first_event(tmp_path: Path) -> None:
    result = promtool_test(tmp_path, shipped_rules(), [alert_case(*case) for case in CASES])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case() -> None:
    assert {rule["alert"] for rule in alerts(shipped_rules())} == {case[0] for case in CASES}


def test_a_counter_born_at_one_is_never_seen_to_rise(tmp_path: Path) -> None:
    """Why the deployables export their counters at 0: the same first internal error on a series that the error
    creates (no sample before it) never fires the alert. The cases above can fail."""
    [case] = [c for c in CASES if c[0] == "GPUFenceWebhookInternalErrors"]
    born_at_one = [{**case[1][0], "values": "_ 1x20"}]
    result = promtool_test(tmp_path, shipped_rules(), [alert_case(case[0], born_at_one, case[2] + 1, case[3])])
    assert result.returncode != 0
    assert "GPUFenceWebhookInternalErrors" in result.stdout + result.stderr


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize(
    "rule", alerts(shipped_rules()), ids=lambda rule: f"{rule['alert']}-{rule['labels']['severity']}"
)
def test_every_alert_links_a_runbook_section_that_exists(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith(RUNBOOKS), url
    assert url.removeprefix(RUNBOOKS) in github_anchors(OPERATIONS.read_text(encoding="utf-8")), url


def test_the_no_ready_replica_alert_is_critical_and_reads_kube_state_metrics() -> None:
    [rule] = [r for r in alerts(shipped_rules()) if r["alert"] == "GPUFenceWebhookNoReadyReplica"]
    assert rule["labels"]["severity"] == "critical"
    assert "kube_deployment_status_replicas_available" in rule["expr"] and 'up{job="gpu-fence-webhook"}' in rule["expr"]
