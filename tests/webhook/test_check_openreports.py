"""``check --format openreports``: OpenReports ``Report`` objects, validated against the API's published definition.

``REPORT_SCHEMA`` is written from openreports/reports-api at commit 769d978 (tag v0.2.1's line):
``config/crd/openreports.io_reports.yaml`` (the CRD's ``openAPIV3Schema`` for ``v1alpha1``, generated from
``apis/openreports.io/v1alpha1/report_types.go``). It keeps what the API server would enforce: every type, every
enum (``result``, ``severity``, ``statusFilter``), every ``required`` list (``results[].policy``;
``results[].timestamp.{seconds,nanos}``; ``configuration.limits``), and that the kind is namespaced. Beyond the
CRD, an object the API server accepts needs a ``metadata.name`` that is a DNS subdomain, and a namespace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_fence.verdicts import Verdict
from gpu_fence.webhook import cli
from gpu_fence.webhook.openreports import REPORT_NAME, reports
from gpu_fence.webhook.policy import NVIDIA_RUNTIME_CLASS, RULES, UPDATE_RULES
from gpu_fence.webhook.reports import Finding, PodSpecResult, Report
from tests.fakes.kubeapi_pods import FakePodsApi, pod, write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"

_STRING = {"type": "string"}
_OUTCOME = {"type": "string", "enum": ["pass", "fail", "warn", "error", "skip"]}
_OBJECT_REFERENCE = {
    "type": "object",
    "properties": {
        name: _STRING for name in ("apiVersion", "fieldPath", "kind", "name", "namespace", "resourceVersion", "uid")
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {"key": _STRING, "operator": _STRING, "values": {"type": "array", "items": _STRING}},
            },
        },
        "matchLabels": {"type": "object", "additionalProperties": _STRING},
    },
}
REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "source": _STRING,
        "scope": _OBJECT_REFERENCE,
        "scopeSelector": _LABEL_SELECTOR,
        "configuration": {
            "type": "object",
            "required": ["limits"],
            "properties": {
                "limits": {
                    "type": "object",
                    "properties": {
                        "maxResults": {"type": "integer"},
                        "statusFilter": {"type": "array", "items": _OUTCOME},
                    },
                }
            },
        },
        "summary": {
            "type": "object",
            "properties": {name: {"type": "integer"} for name in ("error", "fail", "pass", "skip", "warn")},
        },
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["policy"],
                "properties": {
                    "category": _STRING,
                    "message": _STRING,
                    "policy": _STRING,
                    "properties": {"type": "object", "additionalProperties": _STRING},
                    "resourceSelector": _LABEL_SELECTOR,
                    "resources": {"type": "array", "items": _OBJECT_REFERENCE},
                    "result": _OUTCOME,
                    "rule": _STRING,
                    "scored": {"type": "boolean"},
                    "severity": {"type": "string", "enum": ["critical", "high", "low", "medium", "info"]},
                    "source": _STRING,
                    "timestamp": {
                        "type": "object",
                        "required": ["nanos", "seconds"],
                        "properties": {
                            "nanos": {"type": "integer", "minimum": 0, "maximum": 999_999_999},
                            "seconds": {"type": "integer"},
                        },
                    },
                },
            },
        },
    },
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def assert_valid_report(report: dict[str, Any]) -> None:
    jsonschema.validate(report, REPORT_SCHEMA)
    assert (report["apiVersion"], report["kind"]) == ("openreports.io/v1alpha1", "Report")
    # the CRD's scope is Namespaced (kind Report; ClusterReport is the cluster-scoped twin)
    assert _DNS_SUBDOMAIN.match(report["metadata"]["name"]) and report["metadata"]["namespace"]
    counted = {outcome: 0 for outcome in ("pass", "fail", "warn", "error", "skip")}
    for result in report["results"]:
        counted[result["result"]] += 1
    assert report["summary"] == counted


def openreports(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = cli.main(["check", *args, "--format", "openreports"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, list(yaml.safe_load_all(captured.out))


def test_the_schema_catches_what_the_crd_rejects() -> None:
    """The check can fail: each of these breaks one rule of the CRD."""
    good = {"apiVersion": "openreports.io/v1alpha1", "kind": "Report", "metadata": {}, "results": [{"policy": "p"}]}
    jsonschema.validate(good, REPORT_SCHEMA)
    for broken in (
        {"results": [{"rule": "no policy"}]},
        {"results": [{"policy": "p", "result": "failed"}]},
        {"results": [{"policy": "p", "severity": "severe"}]},
        {"results": [{"policy": "p", "timestamp": {"seconds": 1}}]},
        {"results": [{"policy": "p", "properties": {"line": 3}}]},
        {"configuration": {}},
        {"summary": {"fail": "1"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**good, **broken}, REPORT_SCHEMA)


def test_examples_one_report_per_namespace_results_per_rule_and_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, objects = openreports(capsys, str(EXAMPLES))
    assert code == 1  # the exit code is the check's: rejections found
    for report in objects:
        assert_valid_report(report)
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects] == [
        ("default", REPORT_NAME),
        ("kube-system", REPORT_NAME),
    ]
    default, kube_system = objects
    rule_ids = [rule.id for rule in RULES if rule.id not in UPDATE_RULES]  # check sees objects, not updates
    # 33 pod specs in default, each judged by every rule a pod spec can break; and the one warning that is no rule's
    assert len(default["results"]) == 33 * len(rule_ids) + 1
    assert {result["rule"] for result in default["results"]} == {*rule_ids, NVIDIA_RUNTIME_CLASS}
    assert {result["policy"] for result in default["results"]} == {"gpu-fence"}
    failed = {(r["resources"][0]["name"], r["rule"]) for r in default["results"] if r["result"] == "fail"}
    assert failed == {
        ("bypass-unpinned-container", "unpinned-container"),
        ("bypass-visible-devices-env", "visible-devices-env"),
        ("bypass-privileged", "privileged"),
        ("bypass-sys-admin-capability", "sys-admin-capability"),
        ("bypass-device-list-mount", "device-list-mount"),
        ("bypass-cdi-annotation", "cdi-annotation"),
        ("bypass-host-device-path", "host-device-path"),
        ("bypass-mig-control-env", "mig-control-env"),
        ("bypass-kai-fraction", "visible-devices-env"),
        ("bypass-added-capability", "added-capability"),
        ("bypass-host-pid", "host-pid"),
        ("bypass-device-list-mount", "host-path"),
        ("bypass-runtime-annotation", "runtime-annotation"),
        ("bypass-host-proc-root", "host-device-path"),
        ("bypass-host-path", "host-path"),
        ("bypass-imex-channels-env", "imex-channels-env"),
        ("bypass-bound-gpu-pod", "bound-gpu-pod"),
        ("bypass-gated-device-env", "gated-device-env"),
        ("bypass-volume-type", "volume-type"),
        ("bypass-host-process", "host-process"),
        ("bypass-host-ipc", "host-ipc"),
    }
    # a warning is a warn result, counted in summary.warn, never a pass
    warned = {(r["resources"][0]["name"], r["rule"]) for r in default["results"] if r["result"] == "warn"}
    assert warned == {
        ("bypass-visible-devices-none", "visible-devices-none"),
        ("bypass-gpu-env-from", "gpu-env-from"),
        ("nvidia-runtime-no-gpu", "nvidia-runtime-class"),
    }
    assert default["summary"]["warn"] == 3 and default["summary"]["fail"] == len(failed)
    assert default["summary"]["pass"] == len(default["results"]) - 3 - len(failed)
    [none] = [r for r in default["results"] if r["result"] == "warn" and r["rule"] == "visible-devices-none"]
    assert none["message"].startswith('visible-devices-none: container "app" sets NVIDIA_VISIBLE_DEVICES=none')
    [privileged] = [
        r for r in default["results"] if r["result"] == "fail" and r["resources"][0]["name"] == "bypass-privileged"
    ]
    assert privileged["resources"] == [
        {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "bypass-privileged"}
    ]
    assert privileged["message"].startswith('privileged: container "trainer" is privileged')
    assert privileged["properties"] == {
        "verdict": "rejected",
        "source": str(EXAMPLES / "bypass-privileged.yaml"),
        "line": "3",
    }
    # the RayCluster's two pod specs are told apart by their path
    ray = [r for r in default["results"] if r["resources"][0]["kind"] == "RayCluster" and r["rule"] == "privileged"]
    assert [r["properties"]["path"] for r in ray] == [
        "spec.headGroupSpec.template",
        "spec.workerGroupSpecs[0].template",
    ]
    # the exempt DaemonSet: every rule skipped, saying why
    assert {(r["result"], r["message"]) for r in kube_system["results"]} == {
        ("skip", "exempt: namespace kube-system is exempt")
    }


def test_live_pods_carry_their_uid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = [
        pod("team-a", "sneaky", [{"name": "main", "image": "x", "securityContext": {"privileged": True}}]),
        pod("team-b", "gpu", [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    ]
    with FakePodsApi(pods) as fake:
        code, objects = openreports(
            capsys, "--cluster", "--kubeconfig", str(write_kubeconfig(tmp_path / "k", fake.url))
        )
    assert code == 1
    for report in objects:
        assert_valid_report(report)
    assert [(o["metadata"]["namespace"], o["summary"]["fail"]) for o in objects] == [("team-a", 1), ("team-b", 0)]
    assert objects[0]["results"][0]["resources"] == [
        {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "sneaky", "uid": "uid-team-a-sneaky"}
    ]
    assert {r["properties"]["source"] for o in objects for r in o["results"]} == {"cluster"}


def test_a_rule_broken_by_two_containers_is_one_result_and_the_time_is_exact() -> None:
    result = PodSpecResult(
        source="-",
        line=1,
        kind="Pod",
        namespace="ns",
        name="p",
        path="",
        verdict=Verdict.REJECTED,
        violations=(
            Finding("privileged", "a", "container a is privileged", 5),
            Finding("privileged", "b", "container b is privileged", 9),
        ),
    )
    [report] = reports(Report((result,)), RULES, now_ns=1_700_000_000_250_000_000)
    assert_valid_report(report)
    [failed] = [r for r in report["results"] if r["result"] == "fail"]
    assert failed["message"] == "privileged: container a is privileged; privileged: container b is privileged"
    assert failed["timestamp"] == {"seconds": 1_700_000_000, "nanos": 250_000_000}


def test_the_stream_is_what_kubectl_apply_reads(capsys: pytest.CaptureFixture[str]) -> None:
    code, objects = openreports(capsys, str(EXAMPLES / "gpu-pod.yaml"))
    assert code == 0
    # JSON round trip: plain strings, ints and bools only (what the API server stores)
    assert json.loads(json.dumps(objects)) == objects
