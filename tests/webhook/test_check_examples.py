"""``check`` over ``manifests/examples/``: each example's verdict, in all four report formats.

The table below is the examples README's table in code; a test keeps the two in step.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_fence.webhook import cli
from gpu_fence.webhook.policy import RULES, UPDATE_RULES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"

# file -> [(path, verdict, pinned containers, rule ids)], one entry per pod spec, in document order.
EXPECTED: dict[str, list[tuple[str, str, list[str], set[str]]]] = {
    "gpu-pod.yaml": [("", "allowed", [], set())],
    "cuda-without-gpu-request.yaml": [("", "mutated", ["notebook"], set())],
    "deployment.yaml": [("spec.template", "mutated", ["metrics-sidecar"], set())],
    "cronjob.yaml": [("spec.jobTemplate.spec.template", "allowed", [], set())],
    "raycluster.yaml": [
        ("spec.headGroupSpec.template", "mutated", ["ray-head"], set()),
        ("spec.workerGroupSpecs[0].template", "allowed", [], set()),
    ],
    "runtime-class-nvidia.yaml": [("", "mutated", ["smi"], set())],
    "exempt-kube-system.yaml": [("spec.template", "exempt", [], set())],
    "nccl-training.yaml": [("", "allowed", [], set())],
    "kai-fraction.yaml": [("", "mutated", ["gpu-workload", "log-shipper"], set())],
    "dra-gpu-claim.yaml": [("", "mutated", ["ctr"], set())],
    "bypass-unpinned-container.yaml": [("", "rejected", [], {"unpinned-container"})],
    "bypass-visible-devices-env.yaml": [("", "rejected", [], {"visible-devices-env"})],
    "bypass-kai-fraction.yaml": [("", "rejected", [], {"visible-devices-env"})],
    "bypass-dra-claim.yaml": [("", "mutated", ["app"], set())],
    "bypass-visible-devices-none.yaml": [("", "allowed", [], set())],
    "bypass-gpu-env-from.yaml": [("", "allowed", [], set())],
    "bypass-privileged.yaml": [("", "rejected", [], {"privileged"})],
    "bypass-sys-admin-capability.yaml": [("", "rejected", ["app"], {"sys-admin-capability"})],
    "bypass-added-capability.yaml": [("", "rejected", [], {"added-capability"})],
    "bypass-host-pid.yaml": [("", "rejected", [], {"host-pid"})],
    "bypass-device-list-mount.yaml": [("", "rejected", ["app"], {"device-list-mount", "host-path"})],
    "bypass-cdi-annotation.yaml": [("", "rejected", ["app"], {"cdi-annotation"})],
    "bypass-runtime-annotation.yaml": [("", "rejected", ["app"], {"runtime-annotation"})],
    "bypass-host-device-path.yaml": [("", "rejected", ["app"], {"host-device-path"})],
    "bypass-host-proc-root.yaml": [("", "rejected", ["app"], {"host-device-path"})],
    "bypass-host-path.yaml": [("", "rejected", ["app"], {"host-path"})],
    "bypass-mig-control-env.yaml": [("", "rejected", [], {"mig-control-env"})],
    "bypass-imex-channels-env.yaml": [("", "rejected", [], {"imex-channels-env"})],
    "bypass-bound-gpu-pod.yaml": [("", "rejected", [], {"bound-gpu-pod"})],
    "bypass-gated-device-env.yaml": [("", "rejected", [], {"gated-device-env"})],
    "bypass-volume-type.yaml": [("", "rejected", [], {"volume-type"})],
    "bypass-host-process.yaml": [("", "rejected", [], {"host-process"})],
    "bypass-host-ipc.yaml": [("", "rejected", [], {"host-ipc"})],
}
#: The bypass examples of the rules that warn by default: each rejected under its setting (``--config``).
WARN_BY_DEFAULT = {
    "bypass-visible-devices-none.yaml": ("visible_devices_none", "visible-devices-none"),
    "bypass-gpu-env-from.yaml": ("env_from_on_gpu_containers", "gpu-env-from"),
}

# Where SARIF should point: the text of the line (stripped) that each rule's finding lands on.
SARIF_LINE = {
    "unpinned-container": "- name: app",
    "visible-devices-env": "- name: app",
    "privileged": "- name: trainer",
    "sys-admin-capability": "- name: app",
    "added-capability": "- name: app",
    "host-pid": "hostPID: true",
    "device-list-mount": "- name: app",
    "mig-control-env": "- name: app",
    "imex-channels-env": "- name: app",
    "cdi-annotation": "annotations:",
    "runtime-annotation": "annotations:",
    "host-device-path": "volumes:",
    "host-path": "volumes:",
    "bound-gpu-pod": "nodeName: gpu-node-7",
    "gated-device-env": "- name: app",
    "volume-type": "volumes:",
    "host-process": "securityContext:",
    "host-ipc": "hostIPC: true",
}


def run_format(capsys: pytest.CaptureFixture[str], output_format: str) -> tuple[int, str]:
    code = cli.main(["check", str(EXAMPLES), "--format", output_format])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, captured.out


@pytest.fixture(scope="module")
def json_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Module-scoped, so rendered through --output rather than captured with capsys.
    target = tmp_path_factory.mktemp("check") / "report.json"
    assert cli.main(["check", str(EXAMPLES), "--format", "json", "--output", str(target)]) == 1
    return json.loads(target.read_text())


def test_every_example_file_is_in_the_table() -> None:
    on_disk = {path.name for path in EXAMPLES.iterdir() if path.suffix in (".yaml", ".yml", ".json")}
    assert on_disk == set(EXPECTED)


def test_every_rule_has_a_bypass_example_and_every_bypass_example_is_stopped() -> None:
    bypass = {name: entries for name, entries in EXPECTED.items() if name.startswith("bypass-")}
    rejected = {rule for entries in bypass.values() for *_, rules in entries for rule in rules}
    warned = {rule for _, rule in WARN_BY_DEFAULT.values()}
    # a rule only a pod UPDATE breaks has no example: check judges objects, not changes (the README says so)
    assert rejected | warned == {rule.id for rule in RULES} - UPDATE_RULES and not rejected & warned
    for name, entries in bypass.items():  # rejected, or pinned (where the pin is the fix), or warned about
        stopped = all(verdict == "rejected" or (verdict == "mutated" and pinned) for _, verdict, pinned, _ in entries)
        assert stopped or name in WARN_BY_DEFAULT, name


@pytest.mark.parametrize("name", sorted(WARN_BY_DEFAULT))
def test_warn_by_default_examples_warn_and_are_rejected_when_configured(
    name: str, json_report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [result] = [r for r in json_report["results"] if Path(r["source"]).name == name]
    assert result["verdict"] == "allowed" and len(result["warnings"]) == 1
    key, rule = WARN_BY_DEFAULT[name]
    config = tmp_path / "policy.yaml"
    config.write_text(f"{key}: reject\n")
    assert cli.main(["check", str(EXAMPLES / name), "--config", str(config), "--format", "json"]) == 1
    [strict] = json.loads(capsys.readouterr().out)["results"]
    assert strict["verdict"] == "rejected" and [v["rule"] for v in strict["violations"]] == [rule]


def test_json_verdicts_match_the_table(json_report: dict[str, Any]) -> None:
    found: dict[str, list[tuple[str, str, list[str], set[str]]]] = {}
    for result in json_report["results"]:
        entry = (result["path"], result["verdict"], result["pinned"], {v["rule"] for v in result["violations"]})
        found.setdefault(Path(result["source"]).name, []).append(entry)
    assert found == EXPECTED


def test_json_summary_and_common_fields(json_report: dict[str, Any]) -> None:
    assert json_report["summary"] == {
        "pod_specs": 34,
        "allowed": 6,
        "mutated": 7,
        "rejected": 20,
        "exempt": 1,
        "skipped": 0,
    }
    for result in json_report["results"]:
        assert result["namespace"] == ("kube-system" if result["kind"] == "DaemonSet" else "default")
        assert result["name"]
        text = Path(result["source"]).read_text().splitlines()
        assert text[result["line"] - 1].startswith("apiVersion:"), result
    [runtime] = [r for r in json_report["results"] if r["source"].endswith("runtime-class-nvidia.yaml")]
    assert any('runtimeClassName "nvidia"' in warning for warning in runtime["warnings"])


def test_text_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_format(capsys, "text")
    assert code == 1
    for name in EXPECTED:
        assert str(EXAMPLES / name) in out.splitlines()
    assert out.splitlines()[-1] == "34 pod specs: 6 allowed, 7 mutated, 20 rejected, 1 exempt"


def test_junit_format_parses_with_a_failure_per_rejection(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_format(capsys, "junit")
    assert code == 1
    root = ET.fromstring(out)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped"), root.get("errors")) == ("34", "20", "1", "0")
    suites = root.findall("testsuite")
    assert {Path(suite.get("name", "")).name for suite in suites} == set(EXPECTED)
    for suite in suites:
        expected = EXPECTED[Path(suite.get("name", "")).name]
        cases = suite.findall("testcase")
        assert len(cases) == len(expected) == int(suite.get("tests", "-1"))
        for case, (_, verdict, _, rules) in zip(cases, expected, strict=True):
            failure = case.find("failure")
            skipped = case.find("skipped")
            assert (failure is not None) == (verdict == "rejected")
            assert (skipped is not None) == (verdict == "exempt")
            if failure is not None:
                assert failure.get("message") == f"rejected: {', '.join(sorted(rules))}"
                assert all(rule in (failure.text or "") for rule in rules)
            assert case.get("classname") == suite.get("name")
            assert int(case.get("line", "0")) >= 1


def test_sarif_format_structure_and_locations(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_format(capsys, "sarif")
    assert code == 1
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    assert re.match(r"^https://.*sarif-schema-2\.1\.0\.json$", sarif["$schema"])
    [run] = sarif["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "gpu-fence"
    assert [rule["id"] for rule in driver["rules"]] == [rule.id for rule in RULES]
    assert all(rule["shortDescription"]["text"] for rule in driver["rules"])
    results = run["results"]
    expected = sorted((name, rule) for name, entries in EXPECTED.items() for *_, rules in entries for rule in rules)
    found = []
    for result in results:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"].startswith(result["ruleId"])
        [location] = result["locations"]
        physical = location["physicalLocation"]
        name = Path(physical["artifactLocation"]["uri"].removeprefix("file://")).name
        found.append((name, result["ruleId"]))
        line = physical["region"]["startLine"]
        text = (EXAMPLES / name).read_text().splitlines()
        assert text[line - 1].strip() == SARIF_LINE[result["ruleId"]], (name, result["ruleId"])
    assert sorted(found) == expected  # one result per violation, each examples's own


def test_sarif_uses_relative_uris_for_relative_paths(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    cli.main(["check", "manifests/examples/bypass-privileged.yaml", "--format", "sarif"])
    [result] = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "manifests/examples/bypass-privileged.yaml"


def _readme_table() -> dict[str, list[tuple[str, set[str]]]]:
    rows: dict[str, list[tuple[str, set[str]]]] = {}
    current = ""
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not line.startswith("|") or cells[0] in ("file", "---"):
            continue
        if cells[0]:
            current = cells[0].strip("`")
        verdict = re.split(r"[\s:,]", cells[3], maxsplit=1)[0]
        rows.setdefault(current, []).append((verdict, set(re.findall(r"`([a-z-]+)`", cells[4]))))
    return rows


def test_readme_table_matches_the_expected_verdicts() -> None:
    table = _readme_table()
    expected = {name: [(verdict, rules) for _, verdict, _, rules in entries] for name, entries in EXPECTED.items()}
    assert table == expected


# Built-in kinds are validated against the Kubernetes schema, so the examples are what `kubectl apply` accepts;
# the RayCluster is a custom resource (no schema here), and one bypass example is malformed on purpose.
NOT_SCHEMA_CHECKED = {"raycluster.yaml", "bypass-unpinned-container.yaml"}


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - NOT_SCHEMA_CHECKED))
def test_example_is_a_valid_kubernetes_object(name: str) -> None:
    document = yaml.safe_load((EXAMPLES / name).read_text())
    kubernetes_validate.validate(document, "1.37", strict=True)


def test_the_malformed_example_is_rejected_by_the_schema_too() -> None:
    document = yaml.safe_load((EXAMPLES / "bypass-unpinned-container.yaml").read_text())
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(document, "1.37", strict=True)
