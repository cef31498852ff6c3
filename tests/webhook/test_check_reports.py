"""The check's renderers (``webhook.reports``) and line numbers, below the CLI."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.verdicts import Verdict
from gpu_fence.webhook.policy import RULES
from gpu_fence.webhook.reports import (
    Finding,
    PodSpecResult,
    Report,
    artifact_uri,
    render_json,
    render_junit,
    render_sarif,
    render_text,
    result_to_dict,
)
from gpu_fence.webhook.sources import parse_documents

ROOT = Path(__file__).resolve().parents[2]

REJECTED = PodSpecResult(
    "deploy/app.yaml",
    4,
    "Deployment",
    "ml",
    "app",
    "spec.template",
    Verdict.REJECTED,
    pinned=("sidecar",),
    violations=(
        Finding("privileged", "main", 'container "main" is privileged', 20),
        Finding("cdi-annotation", None, 'pod annotation "cdi.k8s.io/x"', 9),
    ),
    warnings=(Finding("gpu-env-from", "main", "a warning", 20),),
    spec_line=12,
)
EXEMPT = PodSpecResult(
    "kube/agent.yaml",
    1,
    "DaemonSet",
    "kube-system",
    "agent",
    "spec.template",
    Verdict.EXEMPT,
    exempt_reason="namespace kube-system is exempt",
)
LIVE = PodSpecResult(
    "cluster",
    0,
    "Pod",
    "team-a",
    "p",
    "",
    Verdict.REJECTED,
    violations=(Finding("privileged", "c", "...", 0),),
)


def test_text_shows_pins_findings_warnings_exemption_and_the_summary() -> None:
    text = render_text(Report((REJECTED, EXEMPT), skipped=2))
    assert (
        "deploy/app.yaml\n"
        "  rejected  Deployment ml/app spec.template (line 4)\n"
        "            pinned NVIDIA_VISIBLE_DEVICES=void on: sidecar\n"
        '            line 20: privileged: container "main" is privileged\n'
        '            line 9: cdi-annotation: pod annotation "cdi.k8s.io/x"\n'
        "            warning: gpu-env-from: a warning\n"
    ) in text
    assert (
        "kube/agent.yaml\n"
        "  exempt    DaemonSet kube-system/agent spec.template (line 1)\n"
        "            exempt: namespace kube-system is exempt\n"
    ) in text
    assert text.endswith(
        "2 pod specs: 0 allowed, 0 mutated, 1 rejected, 1 exempt; 2 skipped (not Kubernetes objects)\n"
    )


def test_json_contract_is_the_documented_one() -> None:
    documented = (ROOT / "docs" / "check.md").read_text()
    block = re.search(r"### `json` \(a contract\).*?```json\n(.*?)```", documented, re.S)
    assert block is not None, "docs/check.md lost its json example"
    example = json.loads(block.group(1))
    rendered = json.loads(render_json(Report((REJECTED, EXEMPT), skipped=3)))
    assert set(example) == set(rendered)
    assert set(example["summary"]) == set(rendered["summary"])
    assert {key for result in example["results"] for key in result} == set(rendered["results"][0])
    violation_keys = {key for r in example["results"] for v in r["violations"] for key in v}
    assert violation_keys == set(rendered["results"][0]["violations"][0])


def test_json_summary_counts() -> None:
    report = json.loads(render_json(Report((REJECTED, EXEMPT, LIVE), skipped=3)))
    assert report["summary"] == {"pod_specs": 3, "allowed": 0, "mutated": 0, "rejected": 2, "exempt": 1, "skipped": 3}
    assert result_to_dict(REJECTED)["violations"][1] == {
        "rule": "cdi-annotation",
        "container": None,
        "message": 'cdi-annotation: pod annotation "cdi.k8s.io/x"',
    }


def test_junit_counts_and_cases() -> None:
    root = ET.fromstring(render_junit(Report((REJECTED, EXEMPT, LIVE))))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "2", "1")
    cases = root.findall("./testsuite/testcase")
    assert [case.get("name") for case in cases] == [
        "Deployment ml/app spec.template",
        "DaemonSet kube-system/agent spec.template",
        "Pod team-a/p",
    ]
    failure = cases[0].find("failure")
    assert failure is not None
    assert failure.get("message") == "rejected: cdi-annotation, privileged"
    assert "privileged [main] line 20:" in (failure.text or "")
    assert "cdi-annotation [pod] line 9:" in (failure.text or "")
    assert "pinned NVIDIA_VISIBLE_DEVICES=void on sidecar" in (cases[0].findtext("system-out") or "")
    assert cases[2].get("line") is None  # a live pod has no file line


def test_junit_with_nothing_found_is_still_valid() -> None:
    root = ET.fromstring(render_junit(Report(())))
    assert (root.tag, root.get("tests"), root.findall("testsuite")) == ("testsuites", "0", [])


def test_sarif_rules_and_results() -> None:
    sarif = json.loads(render_sarif(Report((REJECTED, LIVE)), RULES, tool_version="1.2.3"))
    driver = sarif["runs"][0]["tool"]["driver"]
    assert driver["version"] == "1.2.3"
    by_id = {rule["id"]: rule for rule in driver["rules"]}
    assert set(by_id) == {rule.id for rule in RULES}
    assert "V6" in by_id["privileged"]["properties"]["tags"]
    results = sarif["runs"][0]["results"]
    assert [(r["ruleId"], r["level"]) for r in results] == [
        ("privileged", "error"),
        ("cdi-annotation", "error"),
        ("privileged", "error"),
    ]
    first = results[0]["locations"][0]
    assert first["physicalLocation"] == {"artifactLocation": {"uri": "deploy/app.yaml"}, "region": {"startLine": 20}}
    assert first["logicalLocations"][0]["fullyQualifiedName"] == "Deployment/ml/app/spec.template"
    assert "physicalLocation" not in results[2]["locations"][0]


def test_sarif_result_for_an_unknown_rule_has_no_rule_index() -> None:
    odd = PodSpecResult(
        "a.yaml", 1, "Pod", "d", "p", "", Verdict.REJECTED, violations=(Finding("new-rule", None, "m", 1),)
    )
    [result] = json.loads(render_sarif(Report((odd,)), RULES))["runs"][0]["results"]
    assert "ruleIndex" not in result


def test_artifact_uri() -> None:
    assert artifact_uri("charts/app.yaml") == "charts/app.yaml"
    assert artifact_uri("/srv/repo/app yaml.yaml") == "file:///srv/repo/app%20yaml.yaml"
    assert artifact_uri("-") == "-"


# --- line numbers: a property over generated YAML ------------------------------------------------------------

_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)
_values = st.recursive(
    st.integers() | st.text(alphabet="abc xyz", max_size=5),
    lambda inner: st.lists(inner, min_size=1, max_size=3) | st.dictionaries(_keys, inner, min_size=1, max_size=3),
    max_leaves=15,
)


def _paths(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.append((*prefix, index))
            found.extend(_paths(child, (*prefix, index)))
    return found


class _KubectlDumper(yaml.SafeDumper):
    """Quotes, besides what PyYAML quotes, the strings go-yaml v2 (kubectl) reads as booleans: y, Y, n, N."""


_KubectlDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _values, min_size=1, max_size=4), st.integers(0, 3))
def test_line_of_points_at_the_key_or_item(document: dict[str, Any], blank_lines: int) -> None:
    dumped = yaml.dump(document, Dumper=_KubectlDumper, default_flow_style=False, sort_keys=False)
    text = "\n" * blank_lines + "---\n" + dumped
    [parsed] = parse_documents(text, "generated.yaml")
    lines = text.splitlines()
    assert parsed.line == blank_lines + 2
    for path in _paths(document):
        line = lines[parsed.line_of(path) - 1].lstrip()
        last = path[-1]
        if isinstance(last, str):
            # PyYAML quotes keys that YAML 1.1 would read as booleans ('yes', 'off', ...)
            assert line.lstrip("- ").startswith((f"{last}:", f"'{last}':")), (path, line)
        else:
            assert line.startswith("-"), (path, line)
